"""Compatibility metrics built on the retrieval accuracy M (``orchestrator.metrics.retrieval``).

- ``p_com``, ``p_up``: HBCT eq. 14 and the table version of eq. 15 (hbct.md §11).
- ``empirically_compatible``: Empirical Compatibility Criterion (ECC; d-Simplex §2, λ-orth. eq. 11).
- ``update_summary``: self / cross / old self, ECC, P_com and P_up of one update old → new.
- ``compatibility_matrix`` / ``compatibility_matrices``: C[t][k] = M(Φ_t^Q, Φ_k^G), k <= t
  (d-Simplex §8.2).
- ``average_compatibility`` (AC, d-Simplex §8.3) and ``average_multi_model_accuracy``
  (AA_t / AM, d-Simplex §8.4).
- ``backfill_curve_area``: M~, the area under the partial-backfilling curve (λ-orth. §2.11).
- ``perturbation_scores``: sigmoid P_up / P_comp / P_1-score (prototype perturbation §9.1).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from orchestrator.geometry.spaces import Space
from orchestrator.metrics.retrieval import RetrievalResult, retrieval_metrics

__all__ = [
    "MIN_NORMALISER",
    "backfill_saved",
    "GenerationEmbeddings",
    "PerturbationScores",
    "average_compatibility",
    "average_multi_model_accuracy",
    "backfill_curve_area",
    "compatibility_matrices",
    "compatibility_matrix",
    "empirically_compatible",
    "format_value",
    "p_com",
    "p_up",
    "perturbation_scores",
    "update_summary",
]

_CMC_METRIC = re.compile(r"cmc@([1-9][0-9]*)")
MIN_NORMALISER = 0.01  # the smallest denominator P_com / P_up are reported with (update_summary)


def p_com(cross: float, old_self: float, reference_self: float) -> float:
    """Compatibility gain P_com (HBCT eq. 14).

    ``P_com = (M(φ_n^Q, φ_o^G) − M(φ_o^Q, φ_o^G)) / (M(φ_*^Q, φ_*^G) − M(φ_o^Q, φ_o^G))``.

    Args:
        cross: M(φ_n(Q); φ_o(G)), new query against old gallery.
        old_self: M(φ_o(Q); φ_o(G)).
        reference_self: M(φ_*(Q); φ_*(G)) of the new model trained without alignment; use φ_o and
            φ_* of the same geometry as φ_n (hbct.md §11).
    """
    if reference_self == old_self:
        raise ValueError(
            f"reference_self must differ from old_self, got both equal to {reference_self}"
        )
    return (cross - old_self) / (reference_self - old_self)


def p_up(new_self: float, reference_self: float) -> float:
    """Update gain P_up as used in every HBCT table: ``(M(φ_n; φ_n) − M(φ_*; φ_*)) / M(φ_*; φ_*)``.

    Decision: the self-test M(φ_n(Q); φ_n(G)) is the numerator, not the cross-test of the printed
    eq. 15, because only this version reproduces Table 1 (hbct.md §11: Ext-data CIFAR100 ℓ2 row,
    (0.680 − 0.716)/0.716 = −0.050 printed −0.049, while eq. 15 would give −0.099).
    """
    if reference_self == 0:
        raise ValueError("reference_self must be non-zero, got 0")
    return (new_self - reference_self) / reference_self


def backfill_saved(served: float, old: float, full: float) -> float:
    """Backfill saved: the share of a full backfill's gain that the gallery as served recovers,

    ``(M_served − M_old) / (M_full − M_old)``

    with M_old what the old generation serves on its own gallery, M_full what the new generation
    serves once every item is re-embedded, and M_served the gallery as served: at 0 % re-embedded
    the new queries on the untouched old gallery (M(φ_n^Q, φ_o^G), the cross-test), then along the
    backfilling curve. 1 = nothing left to gain by re-embedding; 0 = no better than the old model.
    Under the weak-reference rule (``update_summary``): NaN where the full backfill beats the old
    model by less than ``MIN_NORMALISER`` (there is no gain to share) or an input is NaN.
    """
    gain = full - old
    if any(math.isnan(v) for v in (served, old, full)) or gain < MIN_NORMALISER:
        return math.nan
    return (served - old) / gain


def empirically_compatible(cross: float, old_self: float) -> bool:
    """ECC: ``M(Φ_t^Q, Φ_k^G) > M(Φ_k^Q, Φ_k^G)`` with strict ">" (a tie is not compatible),
    as in the d-Simplex code (stationary_dsimplex.md §2, §11.13; λ-orthogonality eq. 11)."""
    return bool(cross > old_self)


def update_summary(new_self: float, cross: float, old_self: float,
                   reference_self: float | None = None) -> dict[str, float | bool | None]:
    """The summary of one update φ_o → φ_n for one retrieval metric M (hbct.md §11).

    Returns ``{"self": M(φ_n; φ_n), "cross": M(φ_n^Q; φ_o^G), "old_self": M(φ_o; φ_o),
    "compatible": ECC (cross > old self), "backfill_saved": ``backfill_saved`` at 0 % re-embedded
    (cross − old self) / (self − old self), "p_com": P_com (eq. 14), "p_up": P_up}``. Given no
    reference self-test M(φ_*; φ_*), ``p_com`` and ``p_up`` are None; where one is undefined (a NaN
    input, a reference too weak to normalise by) it is NaN, shown as "n/a".

    Decision (the weak-reference rule): a ratio is reported only when its denominator is at least
    ``MIN_NORMALISER`` (0.01, one point of a metric in [0, 1]): P_com needs the reference to beat
    the old model by that much (M(φ_*; φ_*) − M(φ_o; φ_o) ≥ 0.01), P_up needs M(φ_*; φ_*) ≥ 0.01.
    P_com is the share of the attainable gain φ_o → φ_* that the update recovers on the old
    gallery; with a smaller gain the ratio divides by less than the metric's sampling noise (one
    query of the digits' 539 is 0.0019) and flips sign or explodes (the digits' default run gave
    −5.67 and −48.66 next to a saturated φ_*), so no number is reported.
    """
    summary: dict[str, float | bool | None] = {"self": new_self, "cross": cross, "old_self": old_self,
                                               "compatible": empirically_compatible(cross, old_self),
                                               "backfill_saved": backfill_saved(cross, old_self, new_self),
                                               "p_com": None, "p_up": None}
    if reference_self is not None:
        summary["p_com"] = (_where_defined(p_com, cross, old_self, reference_self)
                            if reference_self - old_self >= MIN_NORMALISER else math.nan)
        summary["p_up"] = reported_p_up(new_self, reference_self)
    return summary


def reported_p_up(new_self: float, reference_self: float) -> float:
    """P_up under the weak-reference rule (``update_summary``): NaN where it is undefined (a NaN
    input, or M(φ_*; φ_*) < ``MIN_NORMALISER``): what the report prints and what the gate's
    ``min_p_up`` checks, the one place the rule is applied."""
    return _where_defined(p_up, new_self, reference_self) if reference_self >= MIN_NORMALISER else math.nan


def format_value(value: float | None, digits: int = 3, width: int = 0) -> str:
    """A right-aligned number with ``digits`` decimals, or "n/a" where it is undefined (None, NaN:
    no reference, a reference too weak to normalise by, no common distance)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"{'n/a':>{width}}"
    return f"{value:>{width}.{digits}f}"


def _where_defined(fn, *args: float) -> float:
    """``fn(*args)``, NaN where it is undefined (a zero denominator, a NaN input)."""
    if any(math.isnan(a) for a in args):
        return math.nan
    try:
        return float(fn(*args))
    except ValueError:
        return math.nan


class GenerationEmbeddings(NamedTuple):
    """Embeddings of the query and gallery sets by one model generation φ_t.

    Attributes:
        queries: (N_q, D) embeddings of the query set.
        gallery: (N_g, D) embeddings of the gallery set.
        space: the space of the embeddings.
        curv: positive curvature magnitude (hyperbolic spaces).
    """

    queries: torch.Tensor | np.ndarray
    gallery: torch.Tensor | np.ndarray
    space: Space | str
    curv: float | torch.Tensor = 1.0


def compatibility_matrices(
    generations: Sequence[GenerationEmbeddings | tuple],
    query_labels: torch.Tensor | np.ndarray | Sequence[int],
    gallery_labels: torch.Tensor | np.ndarray | Sequence[int],
    query_ids: torch.Tensor | np.ndarray | Sequence[int] | None = None,
    gallery_ids: torch.Tensor | np.ndarray | Sequence[int] | None = None,
    ks: Sequence[int] = (1, 5),
    chunk_size: int | None = None,
) -> dict[str, np.ndarray]:
    """Every compatibility matrix C[t][k] = M(Φ_t^Q, Φ_k^G) for k <= t (d-Simplex §8.2).

    Args:
        generations: T generations in training order; each a ``GenerationEmbeddings`` or a tuple
            ``(queries, gallery, space[, curv])``. All generations embed the same query and
            gallery items, in the same order.
        query_labels, gallery_labels, query_ids, gallery_ids, ks, chunk_size: as in
            ``retrieval_metrics`` (ids give leave-one-out for every pair).

    Returns:
        ``{"cmc@k": C, ..., "map": C}``; each C is a (T, T) float64 array with the self-tests on the
        diagonal, cross-tests (newer query, older gallery) below it and NaN above it.

    Raises:
        ValueError: when a pair (t, k) mixes spaces, or hyperbolic curvatures that differ.
        Decision: such a pair has no common distance, so it is refused instead of guessed; map the
        embeddings into one space (e.g. with an adapter) first.
    """
    gens = [_as_generation(g, i) for i, g in enumerate(generations)]
    if not gens:
        raise ValueError("generations must hold at least one generation, got none")
    for t, newer in enumerate(gens):
        for k in range(t):
            _check_same_space(newer, gens[k], t, k)
    ks = tuple(ks)
    num = len(gens)
    matrices = {f"cmc@{k}": np.full((num, num), np.nan) for k in ks}
    matrices["map"] = np.full((num, num), np.nan)
    for t, newer in enumerate(gens):
        for k in range(t + 1):
            older = gens[k]
            result: RetrievalResult = retrieval_metrics(
                newer.queries,
                older.gallery,
                query_labels,
                gallery_labels,
                older.space,
                curv=older.curv,
                ks=ks,
                query_ids=query_ids,
                gallery_ids=gallery_ids,
                chunk_size=chunk_size,
            )
            for cmc_k, value in result.cmc.items():
                matrices[f"cmc@{cmc_k}"][t, k] = value
            matrices["map"][t, k] = result.mean_ap
    return matrices


def compatibility_matrix(
    generations: Sequence[GenerationEmbeddings | tuple],
    query_labels: torch.Tensor | np.ndarray | Sequence[int],
    gallery_labels: torch.Tensor | np.ndarray | Sequence[int],
    metric: str = "cmc@1",
    query_ids: torch.Tensor | np.ndarray | Sequence[int] | None = None,
    gallery_ids: torch.Tensor | np.ndarray | Sequence[int] | None = None,
    chunk_size: int | None = None,
) -> np.ndarray:
    """One (T, T) compatibility matrix for ``metric`` ("cmc@k" for any k >= 1, or "map");
    see ``compatibility_matrices``."""
    match = _CMC_METRIC.fullmatch(metric)
    if metric != "map" and match is None:
        raise ValueError(f"metric must be 'map' or 'cmc@k' with k >= 1, got {metric!r}")
    ks = (int(match.group(1)),) if match else (1,)
    matrices = compatibility_matrices(
        generations,
        query_labels,
        gallery_labels,
        query_ids=query_ids,
        gallery_ids=gallery_ids,
        ks=ks,
        chunk_size=chunk_size,
    )
    return matrices[metric]


def average_compatibility(matrix: np.ndarray | Sequence[Sequence[float]]) -> float:
    """AC = 2/(T(T−1)) Σ_{t=2..T} Σ_{k=1..t−1} 1[C[t][k] > C[k][k]] (d-Simplex §8.3).

    Strict ">": a tie counts as not compatible, as in the official code. Only the lower triangle
    and the diagonal are read. Returns a value in [0, 1].
    """
    c = _as_square_matrix(matrix)
    num = c.shape[0]
    if num < 2:
        raise ValueError(f"matrix must be at least 2x2 for AC, got shape {c.shape}")
    rows, cols = np.tril_indices(num, k=-1)
    compatible = c[rows, cols] > c[cols, cols]
    return float(compatible.sum()) * 2.0 / (num * (num - 1))


def average_multi_model_accuracy(
    matrix: np.ndarray | Sequence[Sequence[float]], t: int | None = None
) -> float:
    """AA_t = 2/(t(t+1)) Σ_{i=1..t} Σ_{k=1..i} C[i][k] (d-Simplex §8.4, "AM" in the code).

    The mean of the self- and cross-tests in the leading t x t lower-triangular block, on the same
    scale as the matrix (multiply by 100 for the paper's %). As in the official code, entries that
    are exactly 0 are ignored (replaced by NaN before averaging).

    Args:
        matrix: (T, T) compatibility matrix; only the lower triangle and diagonal are read.
        t: number of leading generations, 1 <= t <= T; T when None.
    """
    c = _as_square_matrix(matrix)
    num = c.shape[0]
    if t is None:
        t = num
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 1 <= t <= num:
        raise ValueError(f"t must be an int in [1, {num}], got {t!r}")
    rows, cols = np.tril_indices(int(t))
    values = c[rows, cols]
    values = values[values != 0]
    if values.size == 0:
        return math.nan
    return float(values.mean())


def backfill_curve_area(
    fractions: np.ndarray | Sequence[float], values: np.ndarray | Sequence[float]
) -> float:
    """M~ = E_{β~U[0,1]} M(Φ^G_{π,β}, Φ^Q): area under the backfilling curve (λ-orth. §2.11).

    Decision: the expectation over β is the trapezoid rule on the measured points, because the
    paper does not give its β grid.

    Args:
        fractions: (P,) backfilled fractions β, non-decreasing, starting at 0 and ending at 1.
        values: (P,) metric M of the partially backfilled gallery at each β.
    """
    beta = np.asarray(fractions, dtype=np.float64)
    m = np.asarray(values, dtype=np.float64)
    if beta.ndim != 1 or beta.size < 2:
        raise ValueError(f"fractions must be a 1-D array of >= 2 points, got shape {beta.shape}")
    if m.shape != beta.shape:
        raise ValueError(f"values must have shape {beta.shape} like fractions, got {m.shape}")
    if not np.isfinite(beta).all() or not np.isfinite(m).all():
        raise ValueError("fractions and values must be finite")
    if np.any(np.diff(beta) < 0):
        raise ValueError(f"fractions must be sorted in non-decreasing order, got {beta.tolist()}")
    if beta[0] != 0.0 or beta[-1] != 1.0:
        raise ValueError(
            f"fractions must start at 0 and end at 1, got {beta[0]} and {beta[-1]}"
        )
    return float(np.sum(np.diff(beta) * (m[1:] + m[:-1]) / 2.0))


@dataclass(frozen=True)
class PerturbationScores:
    """Sigmoid compatibility scores in % (prototype perturbation §9.1); 50 means parity."""

    p_up: float
    p_comp: float
    p_1: float


def perturbation_scores(
    new_self: float | Sequence[float],
    new_cross: float | Sequence[float],
    old_self: float | Sequence[float],
    reference_self: float | Sequence[float],
) -> PerturbationScores:
    """P_up, P_comp and P_1-score, "following AdvBCT" (prototype_perturbation.md §9.1).

    Per evaluation set d, with σ the logistic sigmoid:
    ``u_d = (M_d(φ_n,φ_n) − M_d(φ_n*,φ_n*)) / M_d(φ_n*,φ_n*)``,
    ``v_d = (M_d(φ_n,φ_o) − M_d(φ_o,φ_o)) / (M_d(φ_n*,φ_n*) − M_d(φ_o,φ_o))``,
    ``P_up,d = σ(u_d)``, ``P_comp,d = σ(v_d)``, ``P1_d = 2 P_up,d P_comp,d / (P_up,d + P_comp,d)``;
    each score is 100 x its mean over the evaluation sets. u and v are ratios, so the metrics may
    be given in [0, 1] or in %.

    Args:
        new_self: M(φ_n, φ_n) per evaluation set (a scalar for one set).
        new_cross: M(φ_n, φ_o) per evaluation set.
        old_self: M(φ_o, φ_o) per evaluation set.
        reference_self: M(φ_n*, φ_n*) of the independently trained new model per evaluation set.
    """
    arrays = {
        "new_self": np.atleast_1d(np.asarray(new_self, dtype=np.float64)),
        "new_cross": np.atleast_1d(np.asarray(new_cross, dtype=np.float64)),
        "old_self": np.atleast_1d(np.asarray(old_self, dtype=np.float64)),
        "reference_self": np.atleast_1d(np.asarray(reference_self, dtype=np.float64)),
    }
    shape = arrays["new_self"].shape
    for name, array in arrays.items():
        if array.ndim != 1 or array.shape != shape or array.size == 0:
            raise ValueError(
                f"{name} must be a scalar or a 1-D sequence of length {shape[0]}, "
                f"got shape {array.shape}"
            )
    n_self, n_cross, o_self, ref = arrays.values()
    if np.any(ref == 0):
        raise ValueError(f"reference_self must be non-zero, got {ref.tolist()}")
    if np.any(ref == o_self):
        raise ValueError(
            f"reference_self must differ from old_self, got {ref.tolist()} and {o_self.tolist()}"
        )
    up = _sigmoid((n_self - ref) / ref)
    comp = _sigmoid((n_cross - o_self) / (ref - o_self))
    f1 = 2.0 * up * comp / (up + comp)
    return PerturbationScores(
        p_up=100.0 * float(up.mean()),
        p_comp=100.0 * float(comp.mean()),
        p_1=100.0 * float(f1.mean()),
    )


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _as_generation(item: GenerationEmbeddings | tuple, index: int) -> GenerationEmbeddings:
    if isinstance(item, GenerationEmbeddings):
        generation = item
    elif isinstance(item, (tuple, list)) and len(item) in (3, 4):
        generation = GenerationEmbeddings(*item)
    else:
        raise ValueError(
            f"generations[{index}] must be a GenerationEmbeddings or a tuple "
            f"(queries, gallery, space[, curv]), got {type(item).__name__}"
        )
    try:
        space = Space(generation.space)
    except ValueError:
        raise ValueError(
            f"generations[{index}].space must be one of {[s.value for s in Space]}, "
            f"got {generation.space!r}"
        ) from None
    return generation._replace(space=space)


def _check_same_space(
    newer: GenerationEmbeddings, older: GenerationEmbeddings, t: int, k: int
) -> None:
    if newer.space != older.space:
        raise ValueError(
            f"generations[{t}] (space {newer.space.value!r}) and generations[{k}] "
            f"(space {older.space.value!r}) live in different spaces; cross retrieval needs one space"
        )
    if newer.space.hyperbolic:
        c_new, c_old = float(newer.curv), float(older.curv)
        if not math.isclose(c_new, c_old, rel_tol=1e-6):
            raise ValueError(
                f"generations[{t}] (curv {c_new}) and generations[{k}] (curv {c_old}) have "
                "different curvatures; cross retrieval needs one curvature"
            )


def _as_square_matrix(matrix: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    c = np.asarray(matrix, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != c.shape[1] or c.shape[0] < 1:
        raise ValueError(f"matrix must be square (T, T) with T >= 1, got shape {c.shape}")
    rows, cols = np.tril_indices(c.shape[0])
    if not np.isfinite(c[rows, cols]).all():
        raise ValueError("matrix must be finite on and below the diagonal")
    return c
