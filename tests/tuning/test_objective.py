"""The sweep's objective: the penalised scalar, constraint filtering, the Pareto front and the best
trial, each checked against a direct computation."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from orchestrator.tuning.config import Objective
from orchestrator.tuning.objective import best_index, feasible, pareto_front, scalar

CONSTRAINED = Objective(maximize="cross_map", subject_to={"metric": "p_up_map", "min": -0.01}, penalty=10)


def brute_force_front(points: np.ndarray) -> np.ndarray:
    """The definition, pair by pair: p is dominated if some q is ≥ in both and > in one."""
    mask = np.zeros(len(points), dtype=bool)
    for i, p in enumerate(points):
        if np.isnan(p).any():
            continue
        dominated = any(not np.isnan(q).any() and q[0] >= p[0] and q[1] >= p[1] and (q[0] > p[0] or q[1] > p[1])
                        for j, q in enumerate(points) if j != i)
        mask[i] = not dominated
    return mask


@pytest.mark.parametrize("seed", range(8))
def test_pareto_front_matches_the_definition(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    # few distinct values: many ties in x, in y, and duplicate points
    points = rng.integers(0, 6, size=(n, 2)).astype(float) / 5
    points[rng.random(n) < 0.1, int(rng.integers(0, 2))] = np.nan
    np.testing.assert_array_equal(pareto_front(points), brute_force_front(points))


def test_pareto_front_of_a_known_set():
    points = np.array([[0.9, 0.1], [0.5, 0.5], [0.1, 0.9], [0.4, 0.4], [0.5, 0.5], [0.9, 0.05], [np.nan, 1.0]])
    assert pareto_front(points).tolist() == [True, True, True, False, True, False, False]
    assert pareto_front(np.empty((0, 2))).tolist() == []
    with pytest.raises(ValueError, match="N, 2"):
        pareto_front(np.zeros((3, 3)))


def test_scalar_penalises_the_constraint_violation_only():
    assert scalar({"cross_map": 0.7, "p_up_map": 0.02}, CONSTRAINED) == 0.7
    assert scalar({"cross_map": 0.7, "p_up_map": -0.01}, CONSTRAINED) == 0.7  # on the bound: feasible
    assert scalar({"cross_map": 0.7, "p_up_map": -0.05}, CONSTRAINED) == pytest.approx(0.7 - 10 * 0.04)
    upper = Objective(maximize="self_map", subject_to={"metric": "cross_map", "max": 0.5}, penalty=2)
    assert scalar({"self_map": 0.9, "cross_map": 0.75}, upper) == pytest.approx(0.9 - 2 * 0.25)
    assert scalar({"self_map": 0.9, "cross_map": 0.5}, Objective(maximize="self_map")) == 0.9
    assert scalar({"self_map": 0.9, "cross_map": 0.5}, Objective(pareto=["self_map", "cross_map"])) == pytest.approx(0.7)
    assert scalar({"cross_map": math.nan, "p_up_map": 0.0}, CONSTRAINED) == -math.inf
    assert scalar({"cross_map": 0.5}, CONSTRAINED) == -math.inf  # the constrained metric is missing


def test_feasibility():
    assert feasible({"p_up_map": -0.01}, CONSTRAINED) and not feasible({"p_up_map": -0.0101}, CONSTRAINED)
    assert not feasible({"p_up_map": math.nan}, CONSTRAINED)
    assert feasible({}, Objective(maximize="cross_map"))


def test_the_best_trial_is_the_best_feasible_one():
    rng = np.random.default_rng(3)
    rows = [{"cross_map": float(c), "p_up_map": float(p)} for c, p in zip(rng.random(30), rng.normal(0, 0.03, 30))]
    rows[7] = {"cross_map": 2.0, "p_up_map": -0.5}  # the largest metric, infeasible
    allowed = [i for i, r in enumerate(rows) if r["p_up_map"] >= -0.01]
    expected = max(allowed, key=lambda i: rows[i]["cross_map"])
    assert best_index(rows, CONSTRAINED) == expected != 7
    assert best_index(rows, Objective(maximize="cross_map")) == 7
    assert best_index([{"cross_map": 0.9, "p_up_map": -0.2}], CONSTRAINED) is None
    assert best_index([], CONSTRAINED) is None


def test_the_best_of_a_pareto_sweep_is_the_front_member_with_the_largest_mean():
    rows = [{"self_map": s, "cross_map": c} for s, c in [(0.9, 0.2), (0.6, 0.6), (0.55, 0.7), (0.5, 0.5), (0.2, 0.9)]]
    objective = Objective(pareto=["self_map", "cross_map"])
    points = np.array([[r["self_map"], r["cross_map"]] for r in rows])
    front = [i for i, on in enumerate(brute_force_front(points)) if on]
    assert front == [0, 1, 2, 4]
    assert best_index(rows, objective) == max(front, key=lambda i: points[i].mean()) == 2
    # ties go to the earliest row
    assert best_index([{"self_map": 0.5, "cross_map": 0.5}] * 2, objective) == 0
    assert all(best_index(list(p), objective) == 0  # equal means: the earlier row
               for p in itertools.permutations([{"self_map": 0.6, "cross_map": 0.4}, {"self_map": 0.4, "cross_map": 0.6}]))
