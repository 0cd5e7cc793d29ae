"""The backfill planner's Ray tasks: priorities scored shard by shard from the stored files, the
exact selection run against them, and the chosen ids written per shard equal one full sort of the
priorities written out from the same files (uncertainty, random, class-mean and least-compatible
orders)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backfill_choices import top_items, whole_shard_order
from orchestrator.backfill import budget_count, compatibility_ranks, least_compatible_priority, random_priority
from orchestrator.backfill.selection import select_top
from orchestrator.config import BackfillPolicy
from orchestrator.distributed.backfill_scores import PriorityRule, ScoredGallery, ShardToScore
from orchestrator.gallery import ShardEmbeddings, read_shard, write_shard
from orchestrator.gallery.shard_files import read_selection
from orchestrator.geometry import lorentz

pytestmark = pytest.mark.e2e


@pytest.fixture
def stored_shards(tmp_path):
    """Five Lorentz shards of a 3,000-item gallery with labels (rounded embeddings: many ties)."""
    rng = np.random.default_rng(1)
    ids = rng.permutation(10**6)[:3000].astype(np.int64)
    tangent = torch.from_numpy(np.round(rng.standard_normal((3000, 4)), 1) * 0.5)
    points = lorentz.expmap0(tangent, 1.0).numpy().astype(np.float32)
    uncertainty = lorentz.uncertainty(torch.from_numpy(points), 1.0).numpy().astype(np.float32)
    labels = rng.integers(0, 6, 3000)
    targets = []
    for index, part in enumerate(np.array_split(np.arange(3000), 5)):
        uri = str(tmp_path / f"shard-{index}.parquet")
        shard = ShardEmbeddings(ids[part], labels[part], points[part], uncertainty[part], "g0", "lorentz", 1.0)
        targets.append(ShardToScore(index, uri, write_shard(uri, shard)))
    return targets


def written_out_priorities(targets, order: str, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per shard (ids, priorities) computed here from the whole gallery (class means over every shard)."""
    shards = [read_shard(t.uri) for t in targets]
    if order == "uncertainty":
        scores = [s.uncertainty.astype(np.float64) for s in shards]
    elif order == "random":
        scores = [random_priority(s.ids, seed) for s in shards]
    else:
        features = np.concatenate([s.embeddings for s in shards]).astype(np.float64)
        labels = np.concatenate([s.labels for s in shards])
        means = {c: features[labels == c].mean(axis=0) for c in np.unique(labels)}
        everything = np.linalg.norm(features - np.stack([means[c] for c in labels]), axis=1)
        scores = np.split(everything, np.cumsum([len(s) for s in shards])[:-1])
    return [(s.ids, sc) for s, sc in zip(shards, scores)]


def chosen_on_ray(scored: ScoredGallery, targets, k: int, tmp_path, fetch_limit: int) -> dict[int, list[int]]:
    """Shard index → sorted ids the exact selection of the top ``k`` chose there, written per shard
    as the gallery step writes them (a selection file, or none for a whole shard)."""
    total = sum(x["n"] for x in scored.summaries)
    threshold, _best = select_top(scored.ask(), k, total, fetch_limit=fetch_limit)
    uris = [str(tmp_path / f"chosen-{t.index}.parquet") for t in targets]
    chosen = {}
    for target, uri, (count, sha) in zip(targets, uris, scored.write_chosen(threshold, uris)):
        if count:
            chosen[target.index] = (read_selection(uri, sha) if sha else np.sort(read_shard(target.uri).ids)).tolist()
    return chosen


@pytest.mark.parametrize("order", ["uncertainty", "random", "class_mean_distance"])
def test_scored_on_ray_the_selection_equals_one_full_sort(local_ray, stored_shards, tmp_path, order):
    seed, budget = 7, 0.37
    scored = ScoredGallery(PriorityRule(order, seed, f"order {order}"), stored_shards)
    parts = written_out_priorities(stored_shards, order, seed)
    chosen = chosen_on_ray(scored, stored_shards, budget_count(budget, 3000), tmp_path, fetch_limit=100)
    assert chosen == top_items(parts, budget_count(budget, 3000))
    means = {x["index"]: x["mean"] for x in scored.summaries}
    for target, (_ids, scores) in zip(stored_shards, parts):  # the shards' mean priorities (budget_unit shards)
        assert means[target.index] == pytest.approx(scores.mean(), rel=1e-12)


def test_an_uncertainty_order_over_flat_embeddings_is_refused_with_the_shard(local_ray, tmp_path):
    uri = str(tmp_path / "flat.parquet")
    shard = ShardEmbeddings(np.arange(4), np.zeros(4, dtype=np.int64), np.ones((4, 3), dtype=np.float32),
                            np.full(4, np.nan, dtype=np.float32), "g0", "cosine", 1.0)
    with pytest.raises(Exception, match="needs hyperbolic .* shard 0 holds generation 'g0' in space 'cosine'"):
        ScoredGallery(PriorityRule("uncertainty", 0, "backfill.order 'uncertainty'"),
                      [ShardToScore(0, uri, write_shard(uri, shard))])


@pytest.fixture
def two_generation_shards(tmp_path):
    """Six cosine shards of 1,200 items: 0-1 hold g0, 2-5 hold g1."""
    rng = np.random.default_rng(2)
    ids = rng.permutation(10**6)[:1200].astype(np.int64)
    targets = []
    for index, part in enumerate(np.array_split(np.arange(1200), 6)):
        uri = str(tmp_path / f"shard-{index}.parquet")
        shard = ShardEmbeddings(ids[part], np.zeros(part.size, dtype=np.int64),
                                rng.standard_normal((part.size, 4)).astype(np.float32),
                                np.full(part.size, np.nan, dtype=np.float32), "g0" if index < 2 else "g1", "cosine", 1.0)
        targets.append(ShardToScore(index, uri, write_shard(uri, shard)))
    return targets


@pytest.mark.parametrize("budget_unit", ["items", "shards"])
def test_least_compatible_scored_on_ray_equals_one_full_sort(local_ray, two_generation_shards, tmp_path,
                                                             budget_unit):
    """g0 searched worse (cross 0.6 against 0.9): its items / shards first."""
    seed, budget, ranks = 5, 0.4, compatibility_ranks({"g0": 0.6, "g1": 0.9})
    scored = ScoredGallery(PriorityRule("least_compatible", seed, "order least_compatible", generation_ranks=ranks),
                           two_generation_shards)
    shards = [read_shard(t.uri) for t in two_generation_shards]
    parts = [(s.ids, least_compatible_priority(s.ids, ranks[s.generation], seed)) for s in shards]
    policy = BackfillPolicy(policy="partial", budget=budget, budget_unit=budget_unit, order="least_compatible")
    means = {x["index"]: x["mean"] for x in scored.summaries}
    assert means == {t.index: pytest.approx(p.mean(), rel=1e-12) for t, (_ids, p) in zip(two_generation_shards, parts)}
    if budget_unit == "shards":  # the step ranks whole shards by these means (backfill.policy.whole_shards)
        ranked = sorted(scored.summaries, key=lambda x: (-x["mean"], x["index"]))[:2]
        assert [x["index"] for x in ranked] == list(whole_shard_order(policy, parts)) and {0, 1} == set(
            whole_shard_order(policy, parts))
        return
    chosen = chosen_on_ray(scored, two_generation_shards, budget_count(budget, 1200), tmp_path, fetch_limit=50)
    assert chosen == top_items(parts, budget_count(budget, 1200))
    assert set(chosen) >= {0, 1} and sum(map(len, chosen.values())) == 480  # all 400 of g0, then 80 of g1


def test_least_compatible_without_a_recorded_value_names_the_generation_and_shard(local_ray, two_generation_shards):
    with pytest.raises(Exception, match="order least_compatible: no compatibility of the new generation with 'g0' "
                                        r"is recorded \(shard [01]\)"):  # whichever task fails first
        ScoredGallery(PriorityRule("least_compatible", 0, "order least_compatible", generation_ranks={"g1": 0}),
                      two_generation_shards)
