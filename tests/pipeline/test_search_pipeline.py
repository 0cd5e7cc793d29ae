"""Serving a mixed-generation gallery end to end (the search issue's "done when").

``pipelines/binary_hyperbolic.yaml`` runs as shipped through the CLI (trained in the driver,
``--set ray.num_workers=0``): three binary-hyperbolic generations with partial backfills, so the
final gallery holds shards of g0, g1 and g2. Then:

- the report's search row (the router through the stored shard indexes) is checked against a
  brute-force ranking computed here from the shard files and the models: mAP of the exact float
  ranking, and the binary index's loss against it is bounded;
- it is reported next to the same-generation number (g1 on its own gallery) and a full backfill;
- ``orchestrator search`` serves g2 over all three generations, and refuses, naming the shards,
  when an older generation that was never evaluated against the newer shards is made to serve.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_runs import cli, cli_in_process
from orchestrator.config import load_pipeline
from orchestrator.data import ImageTensorDataset, channel_statistics, load_digits
from orchestrator.gallery import read_shard
from orchestrator.index import load_index
from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import gallery_eval_key, gate_key
from orchestrator.methods.base import embed_dataset_with_ids
from orchestrator.methods.loading import load_generation
from orchestrator.metrics import retrieval_metrics
from orchestrator.storage import read_json

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "pipelines" / "binary_hyperbolic.yaml"



@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    run = cli("run", str(PIPELINE), "--storage", str(root / "run"), "--set", "ray.num_workers=0",
              "--set", "evaluation.backfill_curves=true", cwd=root)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    config = load_pipeline(str(PIPELINE), {"storage": str(root / "run")})
    return root, config, run.stdout


def g2_queries(config):
    """Every gallery item embedded by g2 here, as the pipeline's preprocessing does (independently
    of the gallery steps)."""
    store = LineageStore(config.lineage)
    record = store.get_generation("g2")
    model, _card = load_generation(record.checkpoint_uri, expected_sha256=record.sha256)
    mean, std = channel_statistics(load_digits("train"))
    out, labels, ids = embed_dataset_with_ids(model, ImageTensorDataset(load_digits("test"), 32, mean, std))
    store.close()
    return out.embedding, labels.numpy(), ids.numpy(), model.curv


def test_three_generations_are_served_and_the_search_matches_a_brute_force_ranking(served):
    root, config, stdout = served
    store = LineageStore(config.lineage)
    shards = [s for s in store.shards("digits-test") if s.n_items]
    by_generation: dict[str, int] = {}
    for shard in shards:
        by_generation[shard.generation] = by_generation.get(shard.generation, 0) + shard.n_items
    assert set(by_generation) == {"g0", "g1", "g2"} and sum(by_generation.values()) == 539
    assert store.current_deployment().generation == "g2"

    # brute force: every stored embedding (all three generations share one Poincaré ball) against
    # g2's queries, exact float Poincaré distances, leave-one-out
    files = [read_shard(s.embeddings_uri, expected_sha256=s.sha256) for s in shards]
    gallery = torch.from_numpy(np.concatenate([f.embeddings for f in files])).double()
    gallery_ids = np.concatenate([f.ids for f in files])
    gallery_labels = np.concatenate([f.labels for f in files])
    queries, labels, ids, curv = g2_queries(config)
    exact = retrieval_metrics(queries.double(), gallery, labels, gallery_labels, "poincare", curv=curv, ks=(1, 5),
                              query_ids=ids, gallery_ids=gallery_ids)

    rows = {row["serving"]: row for row in read_json(str(root / "run" / "reports" / "gallery-digits-test.json"))}
    g2 = rows["g2"]
    assert g2["searched items"] == "539/539" and not g2["not searched"]
    assert g2["mixed map"] == pytest.approx(exact.mean_ap, abs=1e-6)
    assert g2["mixed cmc@1"] == pytest.approx(exact.cmc[1], abs=1e-9)
    # the router's answer through the bit-plane indexes loses little against the exact float ranking
    assert g2["search map"] > exact.mean_ap - 0.03
    assert g2["search cmc@1"] > exact.cmc[1] - 0.03
    # next to the same-generation number (g1 on a gallery of its own) and a full backfill
    assert g2["same-generation"] == "g1" and g2["same-generation map"] == pytest.approx(rows["g1"]["full map"])
    assert g2["search map"] > g2["same-generation map"]  # the update paid off without a full backfill
    assert g2["full map"] >= g2["mixed map"] - 0.01
    assert "search map" in stdout and "539/539" in stdout
    for shard in shards:  # every stored index is a bit-plane index of its shard's items
        index = load_index(shard.index_uri)
        assert index.kind == config.gallery.index and index.ntotal == shard.n_items
    store.close()


def test_the_gate_predicts_no_backfill_as_the_backfilling_curve_measures_it_and_notes_a_wasted_plan(served):
    """The gate's no-backfill figure (the gallery as it stood, searched by the new generation's
    queries) equals the backfilling curve's first point, computed by the curve code from the
    evaluation's embeddings; this file's random shard orders serve below it, and the run says so."""
    _root, config, stdout = served
    store = LineageStore(config.lineage)
    for generation in ("g1", "g2"):
        gate = store.committed_outputs(gate_key("digits-test", generation))
        curve = store.committed_outputs(gallery_eval_key("digits-test", generation))["curve"]["points"]
        assert curve[0][0] == 0.0 and gate["no_backfill"] == pytest.approx(curve[0][1], abs=1e-6)
        assert gate["predicted"] < gate["no_backfill"]
        assert (f"gate of {generation}: the planned backfill serves mAP {gate['predicted']:.4f}, below the "
                f"{gate['no_backfill']:.4f} of re-embedding nothing") in stdout
    store.close()


def test_a_lost_lineage_of_the_mixed_gallery_is_rebuilt_and_searches_the_same(served, tmp_path):
    """Issue 27: a copy of the run loses its lineage; ``verify --rebuild-lineage`` rebuilds the
    three generations, the shards of g0, g1 and g2 and their compatibility values, and ``search``
    returns the same hits as before (every hit's generation and shard included)."""
    root, _config, _stdout = served
    shutil.copytree(root / "run", tmp_path / "run")
    search = ("search", str(PIPELINE), "--storage", str(tmp_path / "run"), "--split", "test", "--limit", "40",
              "-k", "5", "--json")
    before = cli_in_process(*search, cwd=tmp_path)
    assert before.returncode == 0, before.stderr
    (tmp_path / "run" / "lineage.db").unlink()
    rebuilt = cli_in_process("verify", str(PIPELINE), "--storage", str(tmp_path / "run"), "--rebuild-lineage",
                             cwd=tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert "rebuilt: 3 generation(s) (g0, g1, g2), 4 shard(s), 18 compatibility value(s), serving g2" in rebuilt.stdout
    after = cli_in_process(*search, cwd=tmp_path)
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout) == json.loads(before.stdout)
    assert {hit["generation"] for hits in json.loads(after.stdout)["results"] for hit in hits} == {"g0", "g1", "g2"}


def test_orchestrator_search_serves_g2_over_all_three_generations(served):
    root, config, _stdout = served
    out = root / "hits.json"
    run = cli_in_process("search", str(PIPELINE), "--storage", str(root / "run"), "--split", "test", "--limit", "40", "-k", "5",
              "--evaluate", "--json", "--output", str(out), cwd=root)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["serving"] == "g2" and report["searched_items"] == 539 and not report["not_searched"]
    assert report["paths"] == {"g0": "direct", "g1": "direct", "g2": "same"}
    assert len(report["results"]) == 40 and all(len(hits) == 5 for hits in report["results"])
    generations = {hit["generation"] for hits in report["results"] for hit in hits}
    assert generations == {"g0", "g1", "g2"}

    store = LineageStore(config.lineage)
    holder = {}
    for shard in store.shards("digits-test"):
        if shard.n_items:
            for item in read_shard(shard.embeddings_uri, expected_sha256=shard.sha256).ids:
                holder[int(item)] = (shard.index, shard.generation)
    store.close()
    test_ids = load_digits("test").ids[:40]
    for item, hits in zip(test_ids, report["results"]):
        assert all(holder[hit["id"]] == (hit["shard"], hit["generation"]) for hit in hits)
        assert [h["distance"] for h in hits] == sorted(h["distance"] for h in hits)
        if holder[int(item)][1] == "g2":  # a query held by a g2 shard has its own code: distance 0
            assert hits[0]["distance"] == 0.0 and int(item) in [h["id"] for h in hits if h["distance"] == 0.0]
    evaluation = report["evaluation"]
    assert evaluation["k"] == 539 and evaluation["searched_items"] == 539 and 0.5 < evaluation["map"] <= 1.0


def test_a_generation_without_recorded_compatibility_is_refused(served):
    root, _config, _stdout = served
    run = cli_in_process("search", str(PIPELINE), "--storage", str(root / "run"), "--split", "test", "--limit", "3",
              "--serving", "g0", cwd=root)
    assert run.returncode == 2
    assert "generation 'g0' cannot search" in run.stderr
    assert "no compatibility recorded (map on 'test') for g0 → g1" in run.stderr
    assert "no compatibility recorded (map on 'test') for g0 → g2" in run.stderr
    assert "--skip-incompatible" in run.stderr
