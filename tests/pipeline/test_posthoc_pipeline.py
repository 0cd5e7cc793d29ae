"""An upgrade nobody trained to be compatible (issue 39's "done when"): ``pipelines/posthoc.yaml``
runs as shipped through the CLI (trained in the driver, ``--set ray.num_workers=0``). The default
run's old model is upgraded to a ResNet-10-T trained here on its own, through a post-hoc map:

- the post-hoc generation's encoder is the independent one's, unchanged, and only its map was fitted
  (the fit's loss below the mean map's, recorded with the train step);
- its recorded cross-test is recomputed here from the checkpoints (its queries mapped by the stored
  map against g0-old's embeddings), and it passes the criterion and the gate;
- it serves: ``orchestrator search`` answers over g0-old's untouched shards (through the map) and
  its own; the report has backfill saved.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cli_runs import cli, cli_in_process
from orchestrator.config import load_pipeline
from orchestrator.data import ImageTensorDataset, channel_statistics, load_digits
from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import gate_key
from orchestrator.methods.base import embed_dataset_with_ids
from orchestrator.methods.loading import load_generation
from orchestrator.metrics import retrieval_metrics
from orchestrator.models.adapters import BACKWARD_ADAPTER, ChartMap

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "pipelines" / "posthoc.yaml"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("posthoc")
    run = cli("run", str(PIPELINE), "--storage", str(root / "run"), "--set", "ray.num_workers=0", cwd=root)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    config = load_pipeline(str(PIPELINE), {"storage": str(root / "run")})
    store = LineageStore(config.lineage)
    yield root, config, run.stdout, store
    store.close()


def _model(store, name: str):
    record = store.get_generation(name)
    return load_generation(record.checkpoint_uri, expected_sha256=record.sha256)[0], record


def test_the_posthoc_generation_keeps_the_given_encoder_and_fits_only_its_map(served):
    _root, _config, stdout, store = served
    posthoc, record = _model(store, "g1-posthoc")
    given, _ = _model(store, "independent")
    assert all(torch.equal(given.encoder.state_dict()[k], v) for k, v in posthoc.encoder.state_dict().items())
    assert isinstance(posthoc.adapters[BACKWARD_ADAPTER], ChartMap)
    assert record.metrics["loss"] < record.metrics["loss/mean_map"] and record.metrics["fit_seconds"] > 0
    assert ("train:g1-posthoc: low_rank_affine: the encoder of independent frozen, a map to g0-old fitted on at "
            "most 2000 pairs (train items)") in stdout


def test_its_cross_test_is_the_map_applied_to_its_queries_and_passes_the_gate(served):
    _root, config, stdout, store = served
    posthoc, _ = _model(store, "g1-posthoc")
    old, _ = _model(store, "g0-old")
    mean, std = channel_statistics(load_digits("train"))
    data = ImageTensorDataset(load_digits("test"), 32, mean, std)
    queries, labels, ids = embed_dataset_with_ids(posthoc, data)
    gallery, _, _ = embed_dataset_with_ids(old, data)
    with torch.no_grad():
        mapped = posthoc.adapters[BACKWARD_ADAPTER](queries.embedding)
    cross = retrieval_metrics(mapped, gallery.embedding, labels, labels, "lorentz", curv=old.curv, ks=(1,),
                              query_ids=ids, gallery_ids=ids)
    own = retrieval_metrics(gallery.embedding, gallery.embedding, labels, labels, "lorentz", curv=old.curv, ks=(1,),
                            query_ids=ids, gallery_ids=ids)
    recorded = {(v.query, v.gallery, v.metric): v.value for v in store.compatibility_values("test")}
    assert recorded["g1-posthoc", "g0-old", "map"] == pytest.approx(cross.mean_ap, abs=1e-6)
    assert recorded["g0-old", "g0-old", "map"] == pytest.approx(own.mean_ap, abs=1e-6)
    assert cross.mean_ap > own.mean_ap  # the empirical criterion, through the map alone
    gate = store.committed_outputs(gate_key(config.gallery.name, "g1-posthoc"))
    assert gate is not None and store.current_deployment().generation == "g1-posthoc"
    assert "g1-posthoc serves queries" in stdout


def test_it_serves_the_old_shards_through_the_map_and_reports_backfill_saved(served):
    root, config, _stdout, store = served
    out = root / "hits.json"
    run = cli_in_process("search", str(PIPELINE), "--storage", str(root / "run"), "--split", "test", "--limit", "20",
                         "-k", "5", "--evaluate", "--json", "--output", str(out), cwd=root)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["serving"] == "g1-posthoc" and report["searched_items"] == 539 and not report["not_searched"]
    assert report["paths"] == {"g0-old": "queries mapped by the backward adapter", "g1-posthoc": "same"}
    compatibility = json.loads((root / "run" / "reports" / "compatibility.json").read_text())
    saved = compatibility["updates"]["g0-old → g1-posthoc"]["map"]
    assert saved["backfill_saved"] == pytest.approx((saved["cross"] - saved["old_self"])
                                                    / (saved["self"] - saved["old_self"]))
    rows = json.loads((root / "run" / "reports" / f"gallery-{config.gallery.name}.json").read_text())
    served_row = next(row for row in rows if row["serving"] == "g1-posthoc")
    assert served_row["curve backfill saved (map)"][0][0] == 0.0 and served_row["backfill saved map"] is not None
