"""The bounded-memory backfill selection chooses exactly the items one full sort chooses: random
galleries with ties, ±0, negative ids and every budget, split into shards, against the sort written
out; and class means summed shard by shard against the class-mean distances written out."""
from __future__ import annotations

import numpy as np
import pytest

from backfill_choices import chosen_items, top_items
from orchestrator.backfill import budget_count
from orchestrator.backfill.selection import ScoredShard, in_memory_ask, kth_key, priority_keys, select_top
from orchestrator.config import BackfillPolicy
from orchestrator.metrics.class_means import class_sums, distances_to_class_means


def random_gallery(rng, ties: bool):
    n = int(rng.integers(1, 2000))
    ids = rng.choice(10**12, n, replace=False).astype(np.int64) - 5 * 10**11
    scores = rng.standard_normal(n)
    if ties:
        scores = np.round(scores, 1)
        scores[rng.random(n) < 0.3] = -0.0
    bounds = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 6))))
    return ids, scores, np.split(np.arange(n), bounds)


@pytest.mark.parametrize("seed", range(40))
def test_the_selection_equals_one_full_sort(seed):
    rng = np.random.default_rng(seed)
    ids, scores, parts = random_gallery(rng, ties=seed % 2 == 0)
    budget = float(rng.uniform(0.0, 1.0))
    k = budget_count(budget, ids.size)
    shards = [ScoredShard.from_scores(i, ids[p], scores[p]) for i, p in enumerate(parts)]
    threshold, best = select_top(in_memory_ask(shards), k, ids.size, fetch_limit=int(rng.integers(1, 64)))
    chosen = {} if threshold is None else {s.index: s.chosen(threshold) for s in shards}
    # written out: one full sort, score descending, ties by id; shards in the order of their first pick
    shard_of = np.concatenate([np.full(p.size, i) for i, p in enumerate(parts)])
    top = np.lexsort((ids[np.concatenate(parts)], -scores[np.concatenate(parts)]))[:k]
    expected = {int(i): np.sort(ids[np.concatenate(parts)][top][shard_of[top] == i]).tolist()
                for i in np.unique(shard_of[top])}
    assert {i: c.tolist() for i, c in chosen.items() if c.size} == expected
    first_picks = sorted((key, i) for i, key in enumerate(best) if key is not None)
    assert [i for _, i in first_picks] == list(dict.fromkeys(shard_of[top].tolist()))
    # the policy rule the pipeline plans with: the same items, shards in the same order
    policy = BackfillPolicy(policy="partial", budget=budget, budget_unit="items", order="uncertainty")
    by_policy = chosen_items(policy, [(ids[p], scores[p]) for p in parts])
    assert by_policy == expected == top_items([(ids[p], scores[p]) for p in parts], k)
    assert list(by_policy) == list(dict.fromkeys(shard_of[top].tolist()))


def test_keys_order_like_the_planner_and_kth_key_finds_each_rank():
    scores = np.array([0.5, -0.0, 0.0, 2.0, -3.0, 0.5, np.finfo(float).tiny])
    ids = np.array([9, 4, -2, 7, 1, 3, 8], dtype=np.int64)
    high, low = priority_keys(scores, ids)
    by_key = np.lexsort((low, high))
    by_planner = np.lexsort((ids, -scores))
    np.testing.assert_array_equal(by_key, by_planner)
    shards = [ScoredShard.from_scores(0, ids[:3], scores[:3]), ScoredShard.from_scores(1, ids[3:], scores[3:])]
    for rank in range(1, ids.size + 1):
        position = by_planner[rank - 1]
        assert kth_key(in_memory_ask(shards), rank, ids.size, fetch_limit=1) == (int(high[position]), int(low[position]))


def test_class_means_summed_per_shard_give_the_in_memory_distances():
    rng = np.random.default_rng(0)
    features = rng.standard_normal((500, 8))
    labels = rng.integers(0, 7, 500)
    parts = np.array_split(np.arange(500), 3)
    totals: dict[int, list] = {}
    for part in parts:
        classes, sums, counts = class_sums(features[part], labels[part])
        for c, s, n in zip(classes, sums, counts):
            total = totals.setdefault(int(c), [0.0, 0])
            total[0], total[1] = total[0] + s, total[1] + n
    means = {c: s / n for c, (s, n) in totals.items()}
    streamed = np.concatenate([distances_to_class_means(features[p], labels[p], means) for p in parts])
    written_out = np.stack([features[labels == c].mean(axis=0) for c in range(7)])
    expected = np.linalg.norm(features - written_out[labels], axis=1)
    np.testing.assert_allclose(streamed, expected, rtol=1e-12, atol=1e-12)
