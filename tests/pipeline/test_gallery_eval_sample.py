"""The served-gallery report (``gallery-eval``) of a streamed gallery: scored on a seeded labelled
sample when the gallery has labels (every stored shard cut to the sample; the numbers checked
against a ranking computed here from the stored embeddings), and skipped, saying why, when it has
none."""
from __future__ import annotations

import json

import numpy as np
import pytest
import ray
import torch

from local_ray import start_local_ray
from orchestrator.config import PipelineConfig
from orchestrator.data import ImageTensorDataset, channel_statistics, load_digits
from orchestrator.gallery import read_shard
from orchestrator.integrity import trained_outputs
from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import plan_key, train_key
from orchestrator.methods import create_method
from orchestrator.methods.base import embed_dataset_with_ids
from orchestrator.methods.loading import load_generation
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.pipeline.gallery.updater import GalleryUpdater
from streamed_gallery import pipeline_config, write_parquet_gallery

SAMPLE = 200


def _updater(tmp_path, labelled: bool, lines: list[str]) -> tuple[PipelineConfig, LineageStore, GalleryUpdater]:
    write_parquet_gallery(tmp_path / "gallery", labelled=labelled)
    raw = pipeline_config(str(tmp_path / "run"), str(tmp_path / "gallery"), items_per_shard=100)
    raw["generations"] = raw["generations"][:1]
    raw["lineage"] = f"sqlite:///{tmp_path / 'lineage.db'}"
    raw["evaluation"]["gallery_sample"] = SAMPLE
    if labelled:
        raw["gallery"]["options"]["label_column"] = "digit"
    config = PipelineConfig.model_validate(raw)
    store = LineageStore(config.lineage)
    updater = GalleryUpdater(config, store, config.storage, channel_statistics(load_digits("train")),
                             lambda: load_digits("test"), lines.append)
    return config, store, updater


def test_an_unlabelled_gallery_is_not_scored_and_the_step_says_why(tmp_path):
    lines: list[str] = []
    config, store, updater = _updater(tmp_path, labelled=False, lines=lines)
    outputs = updater.evaluator.evaluate(config.generations[0].name, {})
    assert outputs["skipped"].endswith("has no labels") and outputs["gallery_items"] == 539
    assert "mixed" not in outputs
    assert any("skipped" in line and "has no labels" in line for line in lines)
    json.dumps(outputs)
    store.close()


def _mean_average_precision(queries: np.ndarray, query_labels: np.ndarray, gallery: np.ndarray,
                            gallery_labels: np.ndarray) -> float:
    """Full-ranking mAP by cosine distance, written out: AP = mean over relevant items of the
    precision at their rank."""
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    g = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    aps = []
    for similarities, label in zip(q @ g.T, query_labels):
        relevant = gallery_labels[np.argsort(-similarities, kind="stable")] == label
        ranks = np.flatnonzero(relevant) + 1
        aps.append(np.mean(np.arange(1, len(ranks) + 1) / ranks))
    return float(np.mean(aps))


@pytest.mark.e2e
def test_a_labelled_streamed_gallery_is_scored_on_its_sample(tmp_path):
    lines: list[str] = []
    config, store, updater = _updater(tmp_path, labelled=True, lines=lines)
    generation = config.generations[0]
    method = create_method("independent", {})
    torch.manual_seed(0)
    model = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=8), 10, range(10))
    uri = f"{config.storage}/generations/{generation.name}"
    card = save_generation(model, method, None, uri, name=generation.name, parent=None)
    store.upsert_generation(generation.name, parent=None, method="independent")
    store.mark_generation_trained(generation.name, uri, card.sha256, step=train_key(generation.name),
                                  step_outputs=trained_outputs(uri, card.sha256))

    def step(key, action) -> None:
        store.start_step(key)
        action()

    start_local_ray()
    try:
        key = plan_key(updater.ctx.name, generation.name)
        step(key, lambda: updater.planner.plan(generation, key))
        updater.executor.execute(updater.planner.committed_plan(generation.name), generation.name)
    finally:
        ray.shutdown()

    outputs = updater.evaluator.evaluate(generation.name, {generation.name: None})
    assert outputs["evaluated_items"] == SAMPLE and outputs["gallery_items"] == 539
    assert outputs["items_by_generation"] == {generation.name: SAMPLE}
    assert outputs["search"]["map"] is None and "whole gallery" in outputs["search"]["skipped"]
    assert any(f"sample of {SAMPLE} of 539" in line for line in lines)

    # independently: the documented sample (seeded uniform rows), its stored embeddings and labels
    sample = np.sort(np.random.default_rng(0).choice(539, size=SAMPLE, replace=False))
    stored = [read_shard(s.embeddings_uri, expected_sha256=s.sha256) for s in store.shards("photos")]
    ids = np.concatenate([s.ids for s in stored])
    keep = np.isin(ids, sample)
    assert keep.sum() == SAMPLE
    gallery = np.concatenate([s.embeddings for s in stored])[keep]
    labels = np.concatenate([s.labels for s in stored])[keep]
    digits = load_digits("test")
    assert np.array_equal(np.sort(labels), np.sort(digits.labels[np.argsort(digits.ids)][sample]))
    loaded, _card = load_generation(uri, expected_sha256=card.sha256)
    loaded.eval()
    queries, query_labels, _ids = embed_dataset_with_ids(
        loaded, ImageTensorDataset(digits, updater.ctx.image_size, updater.ctx.mean, updater.ctx.std))
    expected = _mean_average_precision(queries.embedding.numpy(), query_labels.numpy(), gallery, labels)
    assert outputs["mixed"]["map"] == pytest.approx(expected, abs=1e-4)
    assert outputs["full_backfill"]["map"] == pytest.approx(expected, abs=1e-4)  # one generation: the same
    store.close()
