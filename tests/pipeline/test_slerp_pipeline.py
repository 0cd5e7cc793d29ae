"""Training-free spherical interpolation through the whole pipeline: ``pipelines/posthoc_slerp.yaml``
(posthoc.yaml's upgrade with cosine generations, ``independent`` for the old model and the other
architecture, and a ``slerp`` generation of weight 0.5), run through the CLI in the driver (5 epochs). The pipeline's evaluation, gallery
evaluation, gate and ``orchestrator search`` compute the slerp queries as the router does:

- the recorded cross-test equals numpy's slerp of the stored Procrustes rotation of the new
  queries with g0-old's own embeddings of the same images;
- the gallery evaluation's search (the router over the stored indexes) equals its mixed-gallery
  ranking, and its backfilling curve at 0 % re-embedded equals the cross-test's backfill saved;
- ``orchestrator search`` serves g0-old's untouched shards along the slerp path, from test images
  or from a query file holding both generations' embeddings of them (the same hits).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_runs import cli, cli_in_process
from orchestrator.config import load_pipeline
from orchestrator.data import ImageTensorDataset, channel_statistics, load_digits
from orchestrator.lineage import LineageStore
from orchestrator.methods.base import embed_dataset_with_ids
from orchestrator.methods.loading import load_generation
from orchestrator.metrics import retrieval_metrics
from orchestrator.models.adapters import BACKWARD_ADAPTER, QueryInterpolation

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# Trained in the driver, 5 epochs instead of the file's 20, the gate forced: every check below compares
# two computations of the same ranking, whatever the models learnt (tests/pipeline/test_posthoc_pipeline.py
# runs posthoc.yaml as shipped, through its gate).
FEWER_EPOCHS = ("--set", "ray.num_workers=0", "--set", "generations.0.training.epochs=5",
                "--set", "generations.1.training.epochs=5", "--set", "generations.2.gate.action=force")
SLERP_PATH = "queries mapped by the backward adapter, interpolated with g0-old's embeddings of them (slerp)"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("slerp")
    pipeline = REPO / "pipelines" / "posthoc_slerp.yaml"
    run = cli("run", str(pipeline), "--storage", str(root / "run"), *FEWER_EPOCHS, cwd=root)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    loaded = load_pipeline(str(pipeline), {"storage": str(root / "run")})
    store = LineageStore(loaded.lineage)
    yield root, pipeline, loaded, store
    store.close()


def _model(store, name: str):
    record = store.get_generation(name)
    return load_generation(record.checkpoint_uri, expected_sha256=record.sha256)[0]


def numpy_slerp(a: np.ndarray, b: np.ndarray, t: float) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    theta = np.arccos(np.clip(np.sum(a * b, axis=1, keepdims=True), -1, 1))
    return (np.sin((1 - t) * theta) * a + np.sin(t * theta) * b) / np.sin(theta)


def test_the_recorded_cross_test_is_numpys_slerp_of_the_two_models_queries(served):
    _root, _pipeline, config, store = served
    new, old = _model(store, "g1-slerp"), _model(store, "g0-old")
    backward = new.adapters[BACKWARD_ADAPTER]
    assert isinstance(backward, QueryInterpolation) and backward.weight == 0.5
    mean, std = channel_statistics(load_digits("train"))
    data = ImageTensorDataset(load_digits("test"), 32, mean, std)
    queries, labels, ids = embed_dataset_with_ids(new, data)
    gallery, _, _ = embed_dataset_with_ids(old, data)
    rotation = backward.align.map.linear.weight.detach().double().numpy()
    unit = queries.embedding.double().numpy()
    unit = unit / np.linalg.norm(unit, axis=1, keepdims=True)
    moved = numpy_slerp(unit @ rotation.T, gallery.embedding.double().numpy(), 0.5)
    cross = retrieval_metrics(torch.from_numpy(moved), gallery.embedding.double(), labels, labels, "cosine", ks=(1,),
                              query_ids=ids, gallery_ids=ids)
    recorded = {(v.query, v.gallery, v.metric): v.value for v in store.compatibility_values("test")}
    assert recorded["g1-slerp", "g0-old", "map"] == pytest.approx(cross.mean_ap, abs=1e-5)
    assert recorded["g1-slerp", "g0-old", "cmc@1"] == pytest.approx(cross.cmc[1], abs=1e-5)


def test_the_gallery_evaluation_and_the_router_rank_slerp_queries_alike(served):
    root, _pipeline, config, _store = served
    rows = json.loads((root / "run" / "reports" / f"gallery-{config.gallery.name}.json").read_text())
    row = next(r for r in rows if r["serving"] == "g1-slerp")
    assert row["search map"] == pytest.approx(row["mixed map"], abs=1e-9)  # router over the stored indexes
    compatibility = json.loads((root / "run" / "reports" / "compatibility.json").read_text())
    saved = compatibility["updates"]["g0-old → g1-slerp"]["map"]["backfill_saved"]
    assert row["curve backfill saved (map)"][0] == [0.0, pytest.approx(saved, abs=1e-5)]  # float32 vs float64 ranks


def test_search_serves_the_old_shards_along_the_slerp_path(served):
    root, pipeline, _config, store = served
    out = root / "hits.json"
    run = cli_in_process("search", str(pipeline), "--storage", str(root / "run"), "--split", "test", "--limit", "20",
                         "-k", "5", "--json", "--output", str(out), cwd=root)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert store.current_deployment().generation == "g1-slerp" == report["serving"]
    assert report["paths"] == {"g0-old": SLERP_PATH, "g1-slerp": "same"} and report["searched_items"] == 539
    assert any(hit["generation"] == "g0-old" for hits in report["results"] for hit in hits)


def test_a_query_file_with_both_generations_embeddings_finds_what_the_images_find(served):
    root, pipeline, _config, store = served
    mean, std = channel_statistics(load_digits("train"))
    data = ImageTensorDataset(load_digits("test").subset(np.arange(20)), 32, mean, std)
    embedded = {name: embed_dataset_with_ids(_model(store, name), data)[0].embedding.numpy()
                for name in ("g1-slerp", "g0-old")}
    np.savez(root / "both.npz", **{f"embeddings@{name}": found for name, found in embedded.items()})
    np.savez(root / "serving-only.npz", embeddings=embedded["g1-slerp"])

    def search(*queries: str) -> dict:
        out = root / "hits.json"
        run = cli_in_process("search", str(pipeline), "--storage", str(root / "run"), *queries, "-k", "5", "--json",
                             "--output", str(out), cwd=root)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        return json.loads(out.read_text())

    from_images = search("--split", "test", "--limit", "20")
    from_file = search("--queries", str(root / "both.npz"))
    assert from_file["paths"] == from_images["paths"] == {"g0-old": SLERP_PATH, "g1-slerp": "same"}
    for by_file, by_image in zip(from_file["results"], from_images["results"], strict=True):
        assert [(h["id"], h["generation"]) for h in by_file] == [(h["id"], h["generation"]) for h in by_image]
        assert [h["distance"] for h in by_file] == pytest.approx([h["distance"] for h in by_image], abs=1e-5)

    refused = cli_in_process("search", str(pipeline), "--storage", str(root / "run"), "--queries",
                             str(root / "serving-only.npz"), cwd=root)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert ("holds generation 'g1-slerp''s embeddings only, but its search interpolates with generation(s) "
            "['g0-old']'s embeddings of the same queries (slerp): give the arrays 'embeddings@g1-slerp', "
            "'embeddings@g0-old' instead") in refused.stderr
