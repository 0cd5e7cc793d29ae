"""The least_compatible backfill order: generations ranked by the new generation's recorded
cross-model metric, every item of a less compatible generation before every item of a more
compatible one, the seeded random order within a generation."""
from __future__ import annotations

import math

import numpy as np
import pytest

from backfill_choices import chosen_items, whole_shard_order
from orchestrator.backfill import compatibility_ranks, least_compatible_priority, random_priority
from orchestrator.config import BackfillPolicy


def test_ranks_put_the_lowest_cross_value_and_an_unsearchable_generation_first():
    ranks = compatibility_ranks({"g0": 0.748, "g1": 0.962, "g1b": 0.962, "flat": None, "bad": math.nan})
    # distinct searchable values, highest first: 0.962 → 0, 0.748 → 1; no common distance → 2
    assert ranks == {"g0": 1, "g1": 0, "g1b": 0, "flat": 2, "bad": 2}
    assert compatibility_ranks({}) == {}


def test_a_higher_rank_comes_first_and_the_random_order_decides_within_a_rank():
    ids = np.arange(1000, 3000, dtype=np.int64)
    low, high = least_compatible_priority(ids, 0, seed=3), least_compatible_priority(ids, 1, seed=3)
    assert low.max() < 1.0 <= high.min() and high.max() < 2.0
    np.testing.assert_array_equal(high - 1.0, low)  # exact: 32-bit random parts, no rounding
    # within a rank the order is random_priority's (cut to 32 bits: no two of these ids tie)
    np.testing.assert_array_equal(np.argsort(-low, kind="stable"), np.argsort(-random_priority(ids, 3), kind="stable"))
    for bad in (-1, 2**20, 1.0, True):
        with pytest.raises(ValueError, match="rank must be an int"):
            least_compatible_priority(ids, bad, seed=3)


def _two_generations() -> list[tuple[np.ndarray, np.ndarray]]:
    """Shards 0-1 of g0 (cross 0.70, 300 items), shards 2-5 of g1 (cross 0.95, 600 items): (ids, priorities)."""
    ranks = compatibility_ranks({"g0": 0.70, "g1": 0.95})
    shards = []
    for index in range(6):
        generation = "g0" if index < 2 else "g1"
        ids = np.arange(index * 150, (index + 1) * 150, dtype=np.int64)
        shards.append((ids, least_compatible_priority(ids, ranks[generation], seed=11)))
    return shards


def test_an_items_budget_takes_a_uniform_sample_of_the_least_compatible_generation_first():
    shards = _two_generations()
    policy = BackfillPolicy(policy="partial", budget=0.2, budget_unit="items", order="least_compatible")
    chosen = np.concatenate(list(chosen_items(policy, shards).values()))  # ⌊0.2 · 900⌋ = 180 of g0's 300 items
    assert chosen.size == 180 and set(chosen) <= set(range(300))
    g0 = np.arange(300, dtype=np.int64)
    expected = g0[np.argsort(-random_priority(g0, 11), kind="stable")][:180]  # the random order's first 180
    assert sorted(chosen.tolist()) == sorted(expected.tolist())
    # a larger budget takes all of g0, then g1's items by the random order
    larger = chosen_items(BackfillPolicy(policy="partial", budget=0.5, budget_unit="items", order="least_compatible"),
                          shards)
    items = [i for ids in larger.values() for i in ids]
    assert set(range(300)) <= set(items) and len(items) == 450


def test_a_shards_budget_takes_the_least_compatible_generations_shards_first():
    order = whole_shard_order(BackfillPolicy(policy="partial", budget=0.5, budget_unit="shards",
                                             order="least_compatible"), _two_generations())
    assert order[:2] in ((0, 1), (1, 0)) and len(order) == 3
    assert order[2] in (2, 3, 4, 5)
