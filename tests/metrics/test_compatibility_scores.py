"""Scalar compatibility metrics against the numbers printed in the papers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from orchestrator.metrics import (
    MIN_NORMALISER,
    average_compatibility,
    average_multi_model_accuracy,
    backfill_curve_area,
    backfill_saved,
    empirically_compatible,
    format_value,
    p_com,
    p_up,
    perturbation_scores,
    update_summary,
)

_HALF_ULP = 5e-4  # the tables print 3 decimals

# HBCT Table 1 rows (hbct.md §12): (φ_o self, φ_* self) of the row's geometry, then the row's
# (self, cross, printed P_up, printed P_com). Each entry is one metric (CMC@1 or mAP) of one row.
HBCT_ROWS = [
    # CIFAR100, Ext-class, Euclidean, BCT, CMC@1 and mAP
    ((0.376, 0.716), (0.695, 0.447, -0.029, 0.210)),
    ((0.310, 0.654), (0.624, 0.328, -0.046, 0.054)),
    # CIFAR100, Ext-class, Lorentz, HBCT, CMC@1 and mAP
    ((0.425, 0.722), (0.722, 0.572, -0.001, 0.495)),
    ((0.330, 0.656), (0.655, 0.398, -0.001, 0.209)),
    # CIFAR100, Ext-data, Euclidean, ℓ2, CMC@1 and mAP
    ((0.572, 0.716), (0.680, 0.645, -0.049, 0.510)),
    ((0.472, 0.654), (0.627, 0.537, -0.042, 0.355)),
    # CIFAR100, New-Arch, Lorentz, HBCT, CMC@1 and mAP
    ((0.723, 0.897), (0.893, 0.886, -0.004, 0.937)),
    ((0.657, 0.882), (0.879, 0.782, -0.004, 0.555)),
    # CIFAR100, Both, Euclidean, BCT (negative P_com), CMC@1
    ((0.386, 0.900), (0.895, 0.358, -0.006, -0.054)),
    # Tiny-ImageNet, Ext-data, Lorentz, HBCT (P_com > 1), CMC@1 and mAP
    ((0.379, 0.548), (0.551, 0.560, 0.007, 1.076)),
    ((0.233, 0.410), (0.414, 0.334, 0.009, 0.572)),
    # Tiny-ImageNet, Both, Lorentz, HBCT, CMC@1 and mAP
    ((0.296, 0.814), (0.812, 0.476, -0.003, 0.348)),
    ((0.213, 0.753), (0.745, 0.313, -0.011, 0.184)),
    # Tiny-ImageNet, Ext-class, Euclidean, AdvBCT, CMC@1
    ((0.273, 0.540), (0.524, 0.254, -0.030, -0.070)),
]


def _rounding_interval(fn, args):
    """[min, max] of fn over inputs perturbed by ± half a printed unit, widened by the output's."""
    values = [
        fn(*(a + d for a, d in zip(args, deltas)))
        for deltas in itertools.product((-_HALF_ULP, _HALF_ULP), repeat=len(args))
    ]
    return min(values) - _HALF_ULP, max(values) + _HALF_ULP


@pytest.mark.parametrize(("reference", "row"), HBCT_ROWS)
def test_p_com_and_p_up_reproduce_hbct_table_1(reference, row):
    old_self, reference_self = reference
    new_self, cross, printed_up, printed_com = row
    lo, hi = _rounding_interval(p_com, (cross, old_self, reference_self))
    assert lo <= printed_com <= hi
    lo, hi = _rounding_interval(p_up, (new_self, reference_self))
    assert lo <= printed_up <= hi


def test_p_up_uses_the_self_test_not_printed_eq_15():
    # hbct.md §11: Ext-data CIFAR100 ℓ2 row; eq. 15 as printed would give (0.645 - 0.716)/0.716.
    assert p_up(0.680, 0.716) == pytest.approx(-0.0503, abs=1e-4)
    assert p_up(0.645, 0.716) != pytest.approx(-0.049, abs=0.01)
    assert p_com(0.716, 0.572, 0.716) == 1.0
    assert p_com(0.572, 0.572, 0.716) == 0.0


def test_p_com_p_up_reject_zero_denominators():
    with pytest.raises(ValueError, match="reference_self"):
        p_com(0.5, 0.4, 0.4)
    with pytest.raises(ValueError, match="reference_self"):
        p_up(0.5, 0.0)


def test_empirical_compatibility_is_strict():
    assert empirically_compatible(0.5655, 0.5562)
    assert not empirically_compatible(0.72114, 0.72374)
    assert not empirically_compatible(0.7, 0.7)


def test_update_summary_of_an_hbct_table_1_row():
    # CIFAR100 Ext-class Lorentz HBCT, CMC@1: old self 0.425, φ_* self 0.722; new self 0.722, cross 0.572
    summary = update_summary(0.722, 0.572, 0.425, 0.722)
    assert summary["self"] == 0.722 and summary["cross"] == 0.572 and summary["old_self"] == 0.425
    assert summary["compatible"] is True  # 0.572 > 0.425
    assert summary["p_com"] == pytest.approx((0.572 - 0.425) / (0.722 - 0.425))  # printed 0.495
    assert summary["p_com"] == pytest.approx(0.495, abs=_HALF_ULP)
    assert summary["p_up"] == pytest.approx(0.0)
    assert update_summary(0.5, 0.4, 0.4)["compatible"] is False  # a tie is not compatible


def test_update_summary_without_a_reference_or_where_p_com_is_undefined():
    assert update_summary(0.7, 0.5, 0.4) == {"self": 0.7, "cross": 0.5, "old_self": 0.4, "compatible": True,
                                             "backfill_saved": pytest.approx((0.5 - 0.4) / (0.7 - 0.4)),
                                             "p_com": None, "p_up": None}
    undefined = update_summary(0.7, 0.5, 0.4, 0.4)  # φ_* self == φ_o self: P_com's denominator is 0
    assert np.isnan(undefined["p_com"]) and undefined["p_up"] == pytest.approx(0.75)
    no_common_distance = update_summary(0.7, float("nan"), 0.4, 0.6)  # NaN cross-test
    assert np.isnan(no_common_distance["p_com"]) and no_common_distance["p_up"] == pytest.approx(1 / 6)
    assert no_common_distance["compatible"] is False
    assert np.isnan(update_summary(0.7, 0.5, 0.4, 0.0)["p_up"])
    weak_reference = update_summary(0.95, 0.90, 0.99, 0.98)  # φ_* below φ_o: no attainable gain to share
    assert np.isnan(weak_reference["p_com"]) and weak_reference["p_up"] == pytest.approx(0.95 / 0.98 - 1)



def test_a_reference_within_one_point_of_the_old_model_leaves_p_com_undefined():
    # the digits' default run, g1 → g2 at CMC@1: φ_* beats φ_o by 0.0056, so P_com would be
    # (0.959 − 0.991) / 0.0056 = −5.7, a ratio of differences smaller than the metric's noise
    assert math.isnan(update_summary(0.976, 0.959, 0.991, 0.9966)["p_com"])
    just_enough = update_summary(0.80, 0.75, 0.70, 0.71)  # φ_* − φ_o = 0.01: reported
    assert just_enough["p_com"] == pytest.approx((0.75 - 0.70) / (0.71 - 0.70))
    assert math.isnan(update_summary(0.80, 0.75, 0.70, 0.709)["p_com"])
    assert update_summary(0.80, 0.75, 0.70, 0.709)["p_up"] == pytest.approx(0.80 / 0.709 - 1)
    # P_up normalises by φ_*'s own accuracy: below 0.01 it is undefined too
    assert math.isnan(update_summary(0.5, 0.4, 0.001, 0.009)["p_up"])
    assert update_summary(0.5, 0.4, 0.0, 0.01)["p_up"] == pytest.approx(0.5 / 0.01 - 1)
    assert MIN_NORMALISER == 0.01  # the rule the docs state (docs/concepts.md)


def test_undefined_values_print_as_n_a():
    assert format_value(float("nan"), 3, 9) == "      n/a"
    assert format_value(None, 3, 5) == "  n/a"
    assert format_value(-1.0123, 3, 9) == "   -1.012"
    assert format_value(0.5) == "0.500"

# Official-code d-Simplex-HOC 7-task matrix (stationary_dsimplex.md §8.4).
DSIMPLEX_MATRIX = [
    [0.58892],
    [0.597, 0.6156],
    [0.6305, 0.65276, 0.69314],
    [0.63336, 0.65298, 0.70626, 0.72374],
    [0.65006, 0.67872, 0.70754, 0.72114, 0.73828],
    [0.6408, 0.67188, 0.71166, 0.72712, 0.74704, 0.76194],
    [0.6314, 0.6635, 0.72096, 0.73496, 0.75232, 0.76652, 0.77164],
]


def _dense(rows, fill):
    out = np.full((len(rows), len(rows)), fill)
    for t, row in enumerate(rows):
        out[t, : len(row)] = row
    return out


@pytest.mark.parametrize("fill", [0.0, np.nan])
def test_ac_and_aa_on_the_dsimplex_example_matrix(fill):
    matrix = _dense(DSIMPLEX_MATRIX, fill)
    assert average_compatibility(matrix) == pytest.approx(20 / 21)
    assert 100 * average_multi_model_accuracy(matrix) == pytest.approx(68.899, abs=5e-4)
    assert 100 * average_multi_model_accuracy(matrix, t=7) == pytest.approx(68.899, abs=5e-4)
    # AA_1 is the first self-test; AA_2 the mean of the 3 entries of the leading 2x2 block.
    assert average_multi_model_accuracy(matrix, t=1) == pytest.approx(0.58892)
    assert average_multi_model_accuracy(matrix, t=2) == pytest.approx((0.58892 + 0.597 + 0.6156) / 3)


def test_ac_counts_ties_as_incompatible_and_aa_ignores_exact_zeros():
    matrix = np.array([[0.5, 0.0, 0.0], [0.5, 0.6, 0.0], [0.7, 0.0, 0.8]])
    # pairs: (2,1) tie -> 0; (3,1) 0.7 > 0.5 -> 1; (3,2) 0.0 > 0.6 -> 0.
    assert average_compatibility(matrix) == pytest.approx(1 / 3)
    # the exact zero at (3,2) is dropped: mean of 0.5, 0.5, 0.6, 0.7, 0.8.
    assert average_multi_model_accuracy(matrix) == pytest.approx(3.1 / 5)


def test_ac_aa_reject_bad_matrices():
    with pytest.raises(ValueError, match="matrix"):
        average_compatibility(np.ones((2, 3)))
    with pytest.raises(ValueError, match="matrix"):
        average_compatibility(np.ones((1, 1)))
    with pytest.raises(ValueError, match="matrix"):
        average_compatibility(np.array([[0.5, 0.0], [np.nan, 0.6]]))
    with pytest.raises(ValueError, match="t must"):
        average_multi_model_accuracy(np.ones((3, 3)), t=4)


# prototype_perturbation.md Table II (GLDv2-trained): per dataset (RParis, ROxford, GLDv2-test).
OLD_R18 = (67.31, 41.82, 7.30)
NEW_R18 = (75.08, 55.77, 12.08)
NEW_R50 = (81.41, 63.59, 15.40)
TABLE_II_ROWS = [
    # (reference_self, new_self, new_cross, printed P_up, P_comp, P_1)
    (NEW_R18, (76.21, 58.02, 12.67), (71.10, 46.42, 8.88), (50.87, 59.44, 54.80)),  # NDPP DE
    (NEW_R18, (71.52, 51.16, 10.38), (68.37, 44.75, 8.72), (47.75, 55.34, 51.23)),  # BCT DE
    (NEW_R18, (67.09, 48.41, 8.75), (65.96, 41.82, 5.72), (45.73, 45.83, 45.75)),  # RACT DE
    (NEW_R18, (76.84, 56.45, 12.44), (70.99, 46.24, 8.60), (50.55, 58.75, 54.32)),  # ODPP DE
    (NEW_R50, (79.55, 62.46, 15.10), (71.96, 49.40, 10.06), (49.50, 58.41, 53.59)),  # ODPP BE
    (NEW_R50, (70.35, 50.00, 9.42), (65.40, 41.48, 8.80), (43.90, 50.28, 46.69)),  # RACT BE
]


@pytest.mark.parametrize(("reference", "new_self", "new_cross", "printed"), TABLE_II_ROWS)
def test_perturbation_scores_reproduce_table_ii(reference, new_self, new_cross, printed):
    scores = perturbation_scores(new_self, new_cross, OLD_R18, reference)
    # printed to 2 decimals (±0.005); inputs are rounded too, so allow one more unit.
    assert scores.p_up == pytest.approx(printed[0], abs=0.011)
    assert scores.p_comp == pytest.approx(printed[1], abs=0.011)
    assert scores.p_1 == pytest.approx(printed[2], abs=0.011)


def test_perturbation_scores_single_dataset_and_scale_invariance():
    # u = (0.8 - 0.75)/0.75, v = (0.6 - 0.5)/(0.75 - 0.5), scores are sigmoids x 100.
    u, v = 0.05 / 0.75, 0.1 / 0.25
    up, comp = 1 / (1 + np.exp(-u)), 1 / (1 + np.exp(-v))
    scores = perturbation_scores(0.8, 0.6, 0.5, 0.75)
    assert scores.p_up == pytest.approx(100 * up)
    assert scores.p_comp == pytest.approx(100 * comp)
    assert scores.p_1 == pytest.approx(100 * 2 * up * comp / (up + comp))
    in_percent = perturbation_scores(80.0, 60.0, 50.0, 75.0)
    assert in_percent.p_1 == pytest.approx(scores.p_1)
    parity = perturbation_scores(0.75, 0.5, 0.5, 0.75)
    assert (parity.p_up, parity.p_comp, parity.p_1) == pytest.approx((50.0, 50.0, 50.0))


def test_perturbation_scores_reject_mismatched_lengths():
    with pytest.raises(ValueError, match="new_cross"):
        perturbation_scores([0.8, 0.7], [0.6], [0.5, 0.4], [0.75, 0.7])
    with pytest.raises(ValueError, match="reference_self"):
        perturbation_scores(0.8, 0.6, 0.5, 0.5)


def test_backfill_area_of_a_linear_curve_is_the_trapezoid():
    # M(β) = 0.3 + 0.4 β -> area = 0.3 + 0.4/2 = 0.5 on any grid.
    for beta in (np.array([0.0, 1.0]), np.linspace(0.0, 1.0, 11), np.array([0.0, 0.1, 0.5, 1.0])):
        assert backfill_curve_area(beta, 0.3 + 0.4 * beta) == pytest.approx(0.5)
    # A non-linear curve: trapezoid value on the given points.
    beta = [0.0, 0.25, 1.0]
    values = [0.2, 0.6, 0.7]
    expected = 0.25 * (0.2 + 0.6) / 2 + 0.75 * (0.6 + 0.7) / 2
    assert backfill_curve_area(beta, values) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("fractions", "values", "message"),
    [
        ([0.0, 0.6, 0.5, 1.0], [1, 2, 3, 4], "sorted"),
        ([0.1, 1.0], [1, 2], "start at 0"),
        ([0.0, 0.9], [1, 2], "end at 1"),
        ([0.0, 1.0], [1, 2, 3], "values"),
        ([0.0], [1], "fractions"),
    ],
)
def test_backfill_area_rejects_bad_curves(fractions, values, message):
    with pytest.raises(ValueError, match=message):
        backfill_curve_area(fractions, values)


def test_backfill_saved_is_the_share_of_the_full_backfill_gain():
    # Spherical interpolation's Flickr30k figures (issue 39): ViT-L/14 queries on an untouched
    # ViT-B/32 gallery reach R@1 48.00 from the old model's 40.62, the new model alone 48.73
    assert backfill_saved(48.00, 40.62, 48.73) == pytest.approx(7.38 / 8.11)  # about 91 %
    assert backfill_saved(0.7, 0.7, 0.9) == 0.0 and backfill_saved(0.9, 0.7, 0.9) == 1.0
    assert backfill_saved(0.6, 0.7, 0.9) == pytest.approx(-0.5)  # worse than not updating
    assert math.isnan(backfill_saved(0.8, 0.7, 0.709))  # a gain below one point: nothing to share
    assert backfill_saved(0.8, 0.7, 0.71) == pytest.approx(10.0)
    assert math.isnan(backfill_saved(float("nan"), 0.7, 0.9))
    assert math.isnan(update_summary(0.7, 0.8, 0.75)["backfill_saved"])  # a new model worse than the old one
