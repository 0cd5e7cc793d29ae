"""Backfill policy rules as the pipeline plans with them (budgets, whole shards, ties), the orders of the
registry, and backfilling curves (mixed gallery, curve, artefacts)."""
import csv
import io

import numpy as np
import pytest
import torch

from backfill_choices import chosen_items, scored_shards, top_items, whole_shard_order
from orchestrator.backfill import backfill_curve, budget_count, mixed_gallery, random_priority, write_backfill_curve
from orchestrator.backfill.orders import OrderInputs, shard_priorities
from orchestrator.backfill.policy import curve_order
from orchestrator.config import BackfillPolicy
from orchestrator.gallery import ShardEmbeddings
from orchestrator.geometry import lorentz
from orchestrator.methods.lambda_orth import backfill_order
from orchestrator.metrics import backfill_curve_area
from orchestrator.metrics.class_means import class_sums, distances_to_class_means


def _parts(sizes, scores):
    """Shards of consecutive ids 0, 1, … with ``scores`` split by ``sizes``."""
    bounds = np.cumsum([0, *sizes])
    scores = np.asarray(scores, dtype=np.float64)
    return [(np.arange(lo, hi), scores[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _class_mean_distances(features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The class-mean order's priorities as the scoring computes them: gallery-wide class means
    from per-class sums, then each item's distance to its own class's mean."""
    classes, sums, counts = class_sums(features, labels)
    means = {int(c): s / n for c, s, n in zip(classes, sums, counts)}
    return distances_to_class_means(features, labels, means)


# ---------------------------------------------------------------- budgets and rounding


@pytest.mark.parametrize("budget,n,expected", [(0.3, 10, 3), (0.29, 100, 29), (0.7, 10, 7), (0.25, 10, 2), (0.05, 10, 0), (1.0, 7, 7)])
def test_budget_count_is_floor_robust_to_float_error(budget, n, expected):
    assert budget_count(budget, n) == expected


@pytest.mark.parametrize("budget", [0.1, 0.25, 0.29, 0.5, 0.99, 1.0])
def test_items_budget_gives_floor_budget_times_items(budget):
    parts = _parts([13, 40, 47], np.linspace(0, 1, 100))
    chosen = chosen_items(BackfillPolicy(policy="partial", budget=budget, order="uncertainty"), parts)
    items = [i for ids in chosen.values() for i in ids]
    assert len(items) == budget_count(budget, 100) == int(np.floor(budget * 100 + 1e-9)) == len(set(items))
    # the highest scores are chosen, gallery-wide
    assert sorted(items) == list(range(100 - len(items), 100))


@pytest.mark.parametrize("budget,expected", [(0.2, 1), (0.3, 1), (0.5, 2), (0.6, 3), (0.99, 4), (1.0, 5)])
def test_shards_budget_gives_floor_budget_times_shards_by_mean_priority(budget, expected):
    # shard means: 2, 0, 4, 1, 3 -> ranking 2, 4, 0, 3, 1
    parts = _parts([3] * 5, np.concatenate([np.full(3, m) for m in (2.0, 0.0, 4.0, 1.0, 3.0)]))
    policy = BackfillPolicy(policy="partial", budget=budget, budget_unit="shards", order="uncertainty")
    assert whole_shard_order(policy, parts) == (2, 4, 0, 3, 1)[:expected]


def test_budget_below_one_unit_is_empty():
    parts = _parts([4] * 5, random_priority(np.arange(20), 0))
    assert whole_shard_order(BackfillPolicy(policy="partial", budget=0.1, budget_unit="shards", order="random"),
                             parts) == ()
    assert chosen_items(BackfillPolicy(policy="partial", budget=0.04, order="random"), parts) == {}


def test_full_takes_every_shard_by_mean_priority_and_the_curve_ranks_the_gallery():
    parts = _parts([3, 2, 4], [5, 1, 2, 9, 9, 0, 0, 0, 7])
    full = BackfillPolicy(policy="full", order="uncertainty")
    assert whole_shard_order(full, parts) == (1, 0, 2)  # means 9, 8/3, 7/4
    keys = [np.stack([s.high, s.low, s.ids.view(np.uint64)], axis=1) for s in scored_shards(parts)]
    assert curve_order(full, [], keys).tolist() == [3, 4, 8, 0, 2, 1, 5, 6, 7]  # ties 9/9 and 0/0/0 by id


def test_ties_are_broken_by_item_id_deterministically():
    parts = [(np.array([7, 3, 5, 1]), np.zeros(4))]
    assert chosen_items(BackfillPolicy(policy="partial", budget=0.5, order="uncertainty"), parts) == {0: [1, 3]}


def test_items_plan_groups_by_shard_in_priority_order():
    parts = _parts([3, 3], [0.1, 0.9, 0.2, 0.8, 0.0, 0.7])
    chosen = chosen_items(BackfillPolicy(policy="partial", budget=0.5, order="class_mean_distance"), parts)
    assert list(chosen.items()) == [(0, [1]), (1, [3, 5])] == list(top_items(parts, 3).items())


# ---------------------------------------------------------------- orders


def test_the_uncertainty_order_puts_low_norm_lorentz_points_first():
    curv = 1.5
    direction = torch.tensor([0.6, 0.8, 0.0], dtype=torch.float64)
    norms = torch.tensor([2.0, 0.1, 5.0, 0.5], dtype=torch.float64)
    space = norms[:, None] * direction
    x = torch.cat([lorentz.time_from_space(space, curv, keepdim=True), space], dim=1)
    uncertainty = lorentz.uncertainty(x, curv).numpy()  # the column a Lorentz generation stores
    assert np.all((uncertainty >= 0) & (uncertainty <= 1))
    shard = ShardEmbeddings(np.arange(4), np.zeros(4, np.int64), x.numpy().astype(np.float32),
                            uncertainty.astype(np.float32), "g0", "lorentz", curv)
    u = shard_priorities(shard, "uncertainty", OrderInputs("order uncertainty"), 0)
    assert np.lexsort((np.arange(4), -u)).tolist() == [1, 3, 0, 2]  # ascending norm = descending uncertainty
    policy = BackfillPolicy(policy="partial", budget=0.5, order="uncertainty")
    assert chosen_items(policy, [(shard.ids, u)]) == {0: [1, 3]}


def test_the_class_mean_order_puts_outliers_first_and_ranks_as_lambda_orth():
    gen = torch.Generator().manual_seed(0)
    centers = torch.tensor([[5.0, 0.0, 0.0], [0.0, 5.0, 0.0]], dtype=torch.float64)
    labels = torch.tensor([0] * 6 + [1] * 6)
    f = centers[labels] + 0.05 * torch.randn(12, 3, generator=gen, dtype=torch.float64)
    f[2] = torch.tensor([-3.0, 4.0, 2.0], dtype=torch.float64)  # outlier of class 0
    f[9] = torch.tensor([4.0, -2.0, 3.0], dtype=torch.float64)  # outlier of class 1
    d = _class_mean_distances(f.numpy(), labels.numpy())
    ranking = np.lexsort((np.arange(12), -d))
    assert set(ranking[:2].tolist()) == {2, 9}
    # the same ranking as lambda_orth.backfill_order (the method's own order)
    assert ranking.tolist() == backfill_order(f, labels, "l2").tolist()
    # written out: ‖f_i − mean of its class‖₂
    means = np.stack([f.numpy()[labels.numpy() == c].mean(axis=0) for c in (0, 1)])
    np.testing.assert_allclose(d, np.linalg.norm(f.numpy() - means[labels.numpy()], axis=1), rtol=1e-12)


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

    def chosen(parts_ids, seed):
        return sorted(i for ids in chosen_items(policy, [(p, random_priority(p, seed)) for p in parts_ids]).values()
                      for i in ids)

    one = chosen([ids], 3)
    assert one == chosen(np.split(ids, [10, 35]), 3) and len(one) == 15
    assert chosen([ids], 4) != one


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
    d = _class_mean_distances(old.double().numpy(), labels.numpy())  # F = identity: the old gallery is comparable
    good = np.lexsort((ids.numpy(), -d))
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
