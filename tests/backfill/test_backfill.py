"""Backfill planner (orders, budgets, none/full) and backfilling curves (mixed gallery, curve, artefacts)."""
import csv
import io

import numpy as np
import pytest
import torch

from orchestrator.backfill import (
    ShardInfo,
    backfill_curve,
    budget_count,
    class_mean_distance_priority,
    mixed_gallery,
    plan_backfill,
    priority_order,
    random_priority,
    uncertainty_priority,
    write_backfill_curve,
)
from orchestrator.config import BackfillPolicy
from orchestrator.geometry import lorentz
from orchestrator.methods.lambda_orth import backfill_order
from orchestrator.metrics import backfill_curve_area


def _shards(sizes, scores=None, start=0):
    out, pos = [], start
    for i, n in enumerate(sizes):
        ids = np.arange(pos, pos + n)
        out.append(ShardInfo(index=i, item_ids=ids, scores=None if scores is None else np.asarray(scores)[pos - start : pos - start + n]))
        pos += n
    return out


# ---------------------------------------------------------------- budgets and rounding


@pytest.mark.parametrize("budget,n,expected", [(0.3, 10, 3), (0.29, 100, 29), (0.7, 10, 7), (0.25, 10, 2), (0.05, 10, 0), (1.0, 7, 7)])
def test_budget_count_is_floor_robust_to_float_error(budget, n, expected):
    assert budget_count(budget, n) == expected


@pytest.mark.parametrize("budget", [0.1, 0.25, 0.29, 0.5, 0.99, 1.0])
def test_items_budget_gives_floor_budget_times_items(budget):
    shards = _shards([13, 40, 47], scores=np.linspace(0, 1, 100))
    plan = plan_backfill(BackfillPolicy(policy="partial", budget=budget, order="uncertainty"), shards)
    assert plan.num_items == budget_count(budget, 100) == int(np.floor(budget * 100 + 1e-9))
    assert len(set(plan.item_ids.tolist())) == plan.num_items
    # the highest scores are chosen, gallery-wide
    assert sorted(plan.item_ids.tolist()) == list(range(100 - plan.num_items, 100))


@pytest.mark.parametrize("budget,expected", [(0.2, 1), (0.3, 1), (0.5, 2), (0.6, 3), (0.99, 4), (1.0, 5)])
def test_shards_budget_gives_floor_budget_times_shards_by_mean_priority(budget, expected):
    # shard means: 2, 0, 4, 1, 3 -> ranking 2, 4, 0, 3, 1
    scores = np.concatenate([np.full(3, m) for m in (2.0, 0.0, 4.0, 1.0, 3.0)])
    plan = plan_backfill(BackfillPolicy(policy="partial", budget=budget, budget_unit="shards", order="uncertainty"), _shards([3] * 5, scores))
    assert plan.shard_indices == (2, 4, 0, 3, 1)[:expected]
    assert all(s.whole for s in plan.shards)
    assert plan.num_items == 3 * expected


def test_budget_below_one_unit_is_empty():
    plan = plan_backfill(BackfillPolicy(policy="partial", budget=0.1, budget_unit="shards", order="random"), _shards([4] * 5))
    assert plan.shards == () and plan.num_items == 0


def test_none_and_full():
    shards = _shards([3, 2, 4], scores=[5, 1, 2, 9, 9, 0, 0, 0, 7])
    none = plan_backfill(BackfillPolicy(policy="none"), shards)
    assert none.shards == () and none.total_items == 9 and none.fraction == 0.0
    # none needs no scores at all
    assert plan_backfill(BackfillPolicy(policy="none"), _shards([3, 2])).num_items == 0
    full = plan_backfill(BackfillPolicy(policy="full", order="uncertainty"), shards)
    assert full.num_items == 9 and full.fraction == 1.0
    assert full.shard_indices == (1, 0, 2)  # means 9, 8/3, 7/4
    assert full.shards[0].item_ids.tolist() == [3, 4]  # tie 9/9 -> by item id
    assert full.shards[1].item_ids.tolist() == [0, 2, 1]
    assert full.shards[2].item_ids.tolist() == [8, 5, 6, 7]  # ties at 0 by id


def test_ties_are_broken_by_item_id_deterministically():
    ids = np.array([7, 3, 5, 1])
    shards = [ShardInfo(0, ids, np.zeros(4))]
    plan = plan_backfill(BackfillPolicy(policy="partial", budget=0.5, order="uncertainty"), shards)
    assert plan.item_ids.tolist() == [1, 3]
    np.testing.assert_array_equal(priority_order(np.zeros(4), ids), [3, 1, 2, 0])


def test_items_plan_groups_by_shard_in_priority_order():
    shards = _shards([3, 3], scores=[0.1, 0.9, 0.2, 0.8, 0.0, 0.7])
    plan = plan_backfill(BackfillPolicy(policy="partial", budget=0.5, order="class_mean_distance"), shards)
    assert plan.shard_indices == (0, 1)
    assert plan.shards[0].item_ids.tolist() == [1] and not plan.shards[0].whole
    assert plan.shards[1].item_ids.tolist() == [3, 5]


def test_bad_inputs():
    with pytest.raises(ValueError, match="needs per-item scores"):
        plan_backfill(BackfillPolicy(policy="partial", budget=0.5, order="uncertainty"), _shards([3]))
    with pytest.raises(ValueError, match="unique"):
        plan_backfill(BackfillPolicy(policy="full"), [ShardInfo(0, np.array([1, 2])), ShardInfo(1, np.array([2]))])
    with pytest.raises(ValueError, match="finite"):
        plan_backfill(BackfillPolicy(policy="full", order="uncertainty"), [ShardInfo(0, np.array([1]), np.array([np.nan]))])


# ---------------------------------------------------------------- order functions


def test_uncertainty_priority_puts_low_norm_lorentz_points_first():
    curv = 1.5
    direction = torch.tensor([0.6, 0.8, 0.0], dtype=torch.float64)
    norms = torch.tensor([2.0, 0.1, 5.0, 0.5], dtype=torch.float64)
    space = norms[:, None] * direction
    x = torch.cat([lorentz.time_from_space(space, curv, keepdim=True), space], dim=1)
    u = uncertainty_priority(x, curv)
    assert u.shape == (4,) and np.all((u >= 0) & (u <= 1))
    np.testing.assert_allclose(u, lorentz.uncertainty(x, curv).numpy())
    ids = np.arange(4)
    assert priority_order(u, ids).tolist() == [1, 3, 0, 2]  # ascending norm = descending uncertainty
    plan = plan_backfill(BackfillPolicy(policy="partial", budget=0.5, order="uncertainty"), [ShardInfo(0, ids, u)])
    assert plan.item_ids.tolist() == [1, 3]


@pytest.mark.parametrize("distance", ["l2", "cosine"])
def test_class_mean_distance_priority_puts_outliers_first_and_matches_lambda_orth(distance):
    gen = torch.Generator().manual_seed(0)
    centers = torch.tensor([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0]], dtype=torch.float64)
    labels = torch.tensor([0] * 6 + [1] * 6)
    f = centers[labels] + 0.05 * torch.randn(12, 3, generator=gen, dtype=torch.float64)
    f[2] = torch.tensor([-3.0, 4.0, 2.0], dtype=torch.float64)  # outlier of class 0
    f[9] = torch.tensor([4.0, -2.0, 3.0], dtype=torch.float64)  # outlier of class 1
    d = class_mean_distance_priority(f, labels, distance)
    assert set(priority_order(d, np.arange(12))[:2].tolist()) == {2, 9}
    # one implementation: the same ranking as lambda_orth.backfill_order
    assert priority_order(d, np.arange(12)).tolist() == backfill_order(f, labels, distance).tolist()


def test_random_priority_is_deterministic_per_seed_and_layout_free():
    ids = np.arange(50)
    a, b, c = random_priority(ids, 1), random_priority(ids, 1), random_priority(ids, 2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.all((a >= 0) & (a < 1))
    # an item's value depends only on (seed, id): permuting / splitting the ids does not change it
    perm = np.random.default_rng(0).permutation(50)
    np.testing.assert_array_equal(random_priority(ids[perm], 1), a[perm])
    policy = BackfillPolicy(policy="partial", budget=0.3, order="random")
    one = plan_backfill(policy, [ShardInfo(0, ids)], seed=3)
    many = plan_backfill(policy, _shards([10, 25, 15]), seed=3)
    assert sorted(one.item_ids.tolist()) == sorted(many.item_ids.tolist())
    assert one.num_items == 15
    assert plan_backfill(policy, [ShardInfo(0, ids)], seed=4).item_ids.tolist() != one.item_ids.tolist()


# ---------------------------------------------------------------- mixed gallery and curves


def test_mixed_gallery_composition():
    old = torch.zeros(5, 2)
    new = torch.arange(10, dtype=torch.float32).reshape(5, 2) + 1
    order = [3, 0, 4, 1, 2]
    out = list(mixed_gallery(old, new, order, [0.0, 0.2, 0.5, 0.99, 1.0]))
    assert [b for b, _ in out] == [0.0, 0.2, 0.5, 0.99, 1.0]
    expected_new = [set(), {3}, {3, 0}, {3, 0, 4, 1}, {0, 1, 2, 3, 4}]  # floor(beta * 5)
    for (_, g), rows in zip(out, expected_new):
        is_new = {i for i in range(5) if torch.equal(g[i], new[i])}
        assert is_new == rows
        assert all(torch.equal(g[i], old[i]) for i in range(5) if i not in rows)
    assert torch.equal(old, torch.zeros(5, 2))  # inputs untouched
    with pytest.raises(ValueError, match="permutation"):
        list(mixed_gallery(old, new, [0, 0, 1, 2, 3], [0.5]))


def _synthetic(seed=0, classes=8, per_class=12, dim=16):
    gen = torch.Generator().manual_seed(seed)
    centers = 4.0 * torch.randn(classes, dim, generator=gen)
    labels = torch.arange(classes).repeat_interleave(per_class)
    n = labels.numel()
    new = centers[labels] + 0.05 * torch.randn(n, dim, generator=gen)  # perfect new model
    old = centers[labels] + 0.3 * torch.randn(n, dim, generator=gen)
    outliers = torch.randperm(n, generator=gen)[: n // 3]
    old[outliers] += 6.0 * torch.randn(len(outliers), dim, generator=gen)  # noisy old embeddings
    return old, new, labels, torch.arange(n)


def test_backfill_curve_rises_from_old_to_new_and_class_mean_order_beats_reversed(tmp_path):
    old, new, labels, ids = _synthetic()
    fractions = [i / 10 for i in range(11)]
    d = class_mean_distance_priority(old, labels)  # F = identity: the old gallery is already comparable
    good = priority_order(d, ids.numpy())
    bad = good[::-1].copy()

    def run(order):
        return backfill_curve(new, old, new, labels, ids, order, fractions, "euclidean", metric="mAP")

    curve_good, curve_bad = run(good), run(bad)
    old_value = backfill_curve(new, old, new, labels, ids, good, [0.0], "euclidean", metric="mAP")[0][1]
    new_value = backfill_curve(new, new, new, labels, ids, good, [0.0], "euclidean", metric="mAP")[0][1]
    assert new_value == pytest.approx(1.0) and old_value < 0.9
    for curve in (curve_good, curve_bad):
        assert [b for b, _ in curve] == fractions
        assert curve[0][1] == pytest.approx(old_value) and curve[-1][1] == pytest.approx(new_value)
    area_good = backfill_curve_area(*zip(*curve_good))
    area_bad = backfill_curve_area(*zip(*curve_bad))
    assert area_good > area_bad + 0.05
    assert curve_good[3][1] > curve_bad[3][1]
    # CMC@1 works too: never worse at the end than at the start, and perfect once fully backfilled
    curve_top1 = backfill_curve(new, old, new, labels, ids, good, [0.0, 1.0], "euclidean", metric="cmc@1")
    assert curve_top1[0][1] <= curve_top1[1][1] == pytest.approx(1.0)

    written = write_backfill_curve(str(tmp_path / "curves" / "gen1"), curve_good, metric="mAP", title="gen1")
    assert written["area"] == pytest.approx(area_good)
    rows = list(csv.reader(io.StringIO((tmp_path / "curves" / "gen1.csv").read_text())))
    assert rows[0] == ["fraction", "mAP"]
    assert [(float(a), float(b)) for a, b in rows[1:]] == curve_good
    png = (tmp_path / "curves" / "gen1.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in (tmp_path / "curves").iterdir() if p.name.startswith(".")]  # no temp files left


def test_backfill_curve_rejects_incomparable_spaces_and_bad_metric():
    old, new, labels, ids = _synthetic()
    order = np.arange(len(ids))
    with pytest.raises(ValueError, match="comparable"):
        backfill_curve(new[:, :8], old, new, labels, ids, order, [0.0], "euclidean")
    with pytest.raises(ValueError, match="metric"):
        backfill_curve(new, old, new, labels, ids, order, [0.0], "euclidean", metric="ndcg")


def test_write_backfill_curve_without_full_range_has_no_area(tmp_path):
    out = write_backfill_curve(str(tmp_path / "c.csv"), [(0.2, 0.5), (0.4, 0.6)])
    assert out["area"] is None and out["csv"].endswith("c.csv") and out["png"].endswith("c.png")
