"""The objective of a sweep: the scalar Tune optimises, feasibility, the Pareto front, the best trial.

With ``metrics`` one trial's evaluation (``METRIC_NAMES`` → value) and ``o`` the file's objective:

    maximize m:                  s = m
    maximize m, c ≥ b (or ≤ b):  s = m − penalty · max(0, b − c)   (resp. max(0, c − b))
    pareto (a, b):               s = (a + b) / 2

``s`` is what the searcher and ASHA compare after every epoch (one number, as they need); a NaN
metric (no common distance between parent and candidate, or an undefined P_com) gives s = −inf.
The penalty only steers the search: the best trial of a constrained sweep is the best *feasible*
one, and of a Pareto sweep the front member with the largest mean. Plain Python and NumPy.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from orchestrator.tuning.config import Objective

OBJECTIVE = "objective"  # the name of s in every trial's reports


def scalar(metrics: Mapping[str, float], objective: Objective) -> float:
    """The number Tune maximises for ``metrics`` (module docstring)."""
    values = [float(metrics.get(name, math.nan)) for name in objective.metrics]
    if any(math.isnan(v) for v in values):
        return -math.inf
    if objective.pareto is not None:
        return (values[0] + values[1]) / 2
    if objective.subject_to is not None:
        return values[0] - objective.penalty * objective.subject_to.violation(values[1])
    return values[0]


def feasible(metrics: Mapping[str, float], objective: Objective) -> bool:
    """Whether ``metrics`` satisfy the objective's constraint (always, without one; never when the
    constrained metric is NaN)."""
    constraint = objective.subject_to
    if constraint is None:
        return True
    value = float(metrics.get(constraint.metric, math.nan))
    return not math.isnan(value) and constraint.violation(value) == 0.0


def pareto_front(points: np.ndarray) -> np.ndarray:
    """Mask (N,) of the points of ``points`` (N, 2) that no other point dominates, both coordinates
    maximised: p is dominated by q when q ≥ p in both and q > p in one. Equal points are all on
    the front; rows with a NaN never are.

    Sweep in order of decreasing x: p = (x, y) is on the front iff y is the largest y among the
    points with the same x and larger than every y of a point with a strictly larger x. O(N log N).
    """
    points = np.asarray(points, dtype=float)
    if points.ndim != 2 or points.shape[1] != 2:
        raise ValueError(f"pareto_front: expected an (N, 2) array, got shape {points.shape}")
    mask = np.zeros(len(points), dtype=bool)
    valid = np.flatnonzero(~np.isnan(points).any(axis=1))
    order = valid[np.lexsort((-points[valid, 1], -points[valid, 0]))]  # by x desc, then y desc
    best_y = -math.inf  # the largest y among points with a strictly larger x
    i = 0
    while i < len(order):
        x = points[order[i], 0]
        group = [order[i]]
        while i + len(group) < len(order) and points[order[i + len(group)], 0] == x:
            group.append(order[i + len(group)])
        group_max = points[group[0], 1]
        if group_max > best_y:
            mask[[j for j in group if points[j, 1] == group_max]] = True
            best_y = group_max
        i += len(group)
    return mask


def best_index(rows: Sequence[Mapping[str, float]], objective: Objective) -> int | None:
    """Position in ``rows`` (each a trial's metrics) of the best trial, or None if none qualifies.

    maximize: the largest metric (finite); constrained: the largest metric among feasible rows;
    pareto: among the front, the largest mean. Ties go to the earliest row.
    """
    if not rows:
        return None
    if objective.pareto is not None:
        points = np.array([[float(r.get(m, math.nan)) for m in objective.pareto] for r in rows])
        candidates = np.flatnonzero(pareto_front(points))
        scores = {int(i): points[i].mean() for i in candidates}
    else:
        scores = {i: float(r.get(objective.maximize, math.nan)) for i, r in enumerate(rows)
                  if feasible(r, objective)}
        scores = {i: s for i, s in scores.items() if not math.isnan(s)}
    if not scores:
        return None
    return max(sorted(scores), key=lambda i: scores[i])
