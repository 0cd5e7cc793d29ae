"""Backfill policies driven through the gallery steps on Ray Data, without training: untrained
generations saved as checkpoints stand in for trained ones. Checks which shards each policy
moves, that plans respect budgets and orders (recomputed here from the stored embeddings), and
that the served gallery's evaluation matches a direct computation."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import ray
import torch
import yaml

from local_ray import start_local_ray
from orchestrator.backfill import random_priority
from orchestrator.config import PipelineConfig
from orchestrator.data import channel_statistics, load_digits
from orchestrator.gallery import ShardEmbeddings, read_shard, write_shard
from orchestrator.integrity import trained_outputs
from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import plan_key, train_key
from orchestrator.methods import create_method
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.pipeline.gallery.updater import GalleryUpdater

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def local_ray():
    start_local_ray()
    yield
    ray.shutdown()


def config_with(tmp_path, generations: list[tuple[str, str | None, dict]]) -> PipelineConfig:
    raw = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    template = raw["generations"][1]
    raw["generations"] = [{**template, "name": name, "parent": parent, "classes": None, "backfill": policy}
                          for name, parent, policy in generations]
    raw.update(storage=str(tmp_path / "run"), evaluation={"reference": None, "backfill_curves": True})
    raw["data"]["scenario"] = "custom"
    raw["gallery"]["embedding"] = {"batch_size": 128, "concurrency": 1, "num_cpus": 1}
    return PipelineConfig.model_validate(raw)


def updater_for(config: PipelineConfig, tmp_path) -> tuple[GalleryUpdater, LineageStore]:
    store = LineageStore(config.lineage)
    stats = channel_statistics(load_digits("train"))
    for seed, generation in enumerate(config.generations):
        method = create_method("hbct", {"clip": 1.2})
        torch.manual_seed(seed)
        model = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=8), 10, range(10))
        uri = str(tmp_path / "run" / "generations" / generation.name)
        card = save_generation(model, method, None, uri, name=generation.name, parent=generation.parent)
        store.upsert_generation(generation.name, parent=generation.parent, method="hbct")
        store.mark_generation_trained(generation.name, uri, card.sha256, step=train_key(generation.name),
                                      step_outputs=trained_outputs(uri, card.sha256))
    updater = GalleryUpdater(config, store, str(tmp_path / "run"), stats, lambda: load_digits("test"), lambda line: None)
    return updater, store


def serve(updater: GalleryUpdater, store: LineageStore, generation) -> None:
    key = plan_key(updater.ctx.name, generation.name)
    store.start_step(key)
    updater.planner.plan(generation, key)
    updater.executor.execute(updater.planner.committed_plan(generation.name), generation.name)


def items_by_shard(store: LineageStore) -> dict[int, tuple[str, np.ndarray]]:
    return {s.index: (s.generation, read_shard(s.embeddings_uri, expected_sha256=s.sha256).ids)
            for s in store.shards("digits-test")}


def test_none_full_and_partial_policies_move_the_planned_shards(local_ray, tmp_path):
    config = config_with(tmp_path, [
        ("g0", None, {"policy": "none"}),
        ("g1", "g0", {"policy": "none"}),
        ("g2", "g1", {"policy": "partial", "budget": 0.5, "budget_unit": "shards", "order": "random"}),
        ("g3", "g2", {"policy": "partial", "budget": 0.2, "budget_unit": "items", "order": "uncertainty"}),
        ("g4", "g3", {"policy": "full", "order": "random"}),
    ])
    updater, store = updater_for(config, tmp_path)
    g0, g1, g2, g3, g4 = config.generations
    all_ids = np.sort(load_digits("test").ids)

    serve(updater, store, g0)  # first population, whatever the policy
    first = items_by_shard(store)
    assert [g for g, _ in first.values()] == ["g0"] * 4
    assert np.array_equal(np.sort(np.concatenate([ids for _, ids in first.values()])), all_ids)

    serve(updater, store, g1)  # none: nothing moves
    assert updater.planner.committed_plan("g1").entries == ()
    assert {i: (g, ids.tolist()) for i, (g, ids) in items_by_shard(store).items()} == \
        {i: (g, ids.tolist()) for i, (g, ids) in first.items()}

    serve(updater, store, g2)  # two of four shards, by mean seeded-random priority
    seed = g2.training.seed
    means = {i: random_priority(ids, seed).mean() for i, (_, ids) in first.items()}
    expected = sorted(sorted(means, key=lambda i: (-means[i], i))[:2])
    after_g2 = items_by_shard(store)
    assert sorted(i for i, (g, _) in after_g2.items() if g == "g2") == expected

    before_g3 = {i: read_shard(s.embeddings_uri) for i, s in enumerate(store.shards("digits-test"))}
    serve(updater, store, g3)  # ⌊0.2·539⌋ = 107 most uncertain items move to new shards
    every_uncertainty = np.concatenate([s.uncertainty for s in before_g3.values()])
    every_id = np.concatenate([s.ids for s in before_g3.values()])
    most_uncertain = set(every_id[np.lexsort((every_id, -every_uncertainty.astype(np.float64)))[:107]].tolist())
    after_g3 = items_by_shard(store)
    moved = {int(i) for g, ids in after_g3.values() if g == "g3" for i in ids}
    assert moved == most_uncertain
    assert len(after_g3) == 4 + len(updater.planner.committed_plan("g3").entries)

    serve(updater, store, g4)  # full: every shard, none left behind
    final = items_by_shard(store)
    assert {g for g, _ in final.values()} == {"g4"}
    every = np.concatenate([ids for _, ids in final.values()])
    assert np.array_equal(np.sort(every), all_ids)
    history = [(b.shard_index, b.from_generation, b.to_generation) for b in store.backfills("digits-test")]
    assert all(b.status == "committed" for b in store.backfills("digits-test"))
    assert sum(1 for _, _, to in history if to == "g4") == len(final)

    outputs = updater.evaluator.evaluate("g4", {g.name: g.parent for g in config.generations})
    # a fully backfilled gallery: the actors' batches differ from the local pass's, so float32 near-ties
    # may swap (the untrained models embed many items almost alike)
    assert outputs["mixed"]["map"] == pytest.approx(outputs["full_backfill"]["map"], abs=1e-5)
    points = outputs["curve"]["points"]
    assert points[-1][1] == pytest.approx(outputs["full_backfill"]["map"])
    assert Path(outputs["curve"]["png"]).stat().st_size > 0


def test_an_uncertainty_order_on_a_flat_gallery_is_refused_with_the_field(local_ray, tmp_path):
    config = config_with(tmp_path, [("g0", None, {"policy": "none"}),
                                    ("g1", "g0", {"policy": "partial", "budget": 0.5, "order": "uncertainty"})])
    updater, store = updater_for(config, tmp_path)
    serve(updater, store, config.generations[0])
    shard = store.shards("digits-test")[0]
    data = read_shard(shard.embeddings_uri)
    flat = ShardEmbeddings(data.ids, data.labels, data.embeddings, data.uncertainty, "g0", "cosine", 1.0)
    store.assign_shard("digits-test", 0, "g0", shard.embeddings_uri, shard.index_uri, write_shard(shard.embeddings_uri, flat),
                       shard.n_items)
    with pytest.raises(ValueError, match="generation 'g1' backfill.order 'uncertainty': needs hyperbolic"):
        serve(updater, store, config.generations[1])
