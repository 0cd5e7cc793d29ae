"""Backfilling curves: retrieval quality of a partially re-embedded gallery versus the fraction
re-embedded (λ-orthogonality §2.11, after FastFill), and its CSV / PNG artefacts.

Φ^G_{π,β}: for an order π over the N gallery items and β ∈ [0, 1], the first ``⌊β·N⌋`` items of
π use their NEW embedding and the rest keep the OLD one. The curve is M(Φ^G_{π,β}, Φ^Q) over a
grid of β; its area M~ is ``orchestrator.metrics.backfill_curve_area`` (trapezoid rule).

Comparable space (decision): the queries, the old gallery and the new gallery must all live in
ONE space where a distance between a query and either kind of gallery item is meaningful:

- compatible-by-training methods (BCT, HBCT, ...): queries φ_new(Q), old gallery φ_old(G), new
  gallery φ_new(G), in the shared space (``space`` / ``curv``, e.g. Lorentz for HBCT);
- λ-orthogonality (§2.10-2.11): queries B(φ_new(Q)), old gallery F(φ_old(G))
  (``lambda_orth.forward_transform``), new gallery B(φ_new(G)).

The caller does the transforms (and any truncation to a common width); this module only checks
that the three arrays have the same width.
"""
from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from orchestrator.backfill.policy import budget_count
from orchestrator.metrics import backfill_curve_area, retrieval_metrics
from orchestrator.storage import write_bytes_atomic

__all__ = [
    "DEFAULT_FRACTIONS",
    "backfill_curve",
    "mixed_gallery",
    "write_backfill_curve",
]

DEFAULT_FRACTIONS: tuple[float, ...] = tuple(i / 10 for i in range(11))
"""β grid used when none is given (the paper does not give one, §2.11): 0, 0.1, ..., 1."""


def _as_tensor(x: torch.Tensor | np.ndarray, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (N, D), got shape {tuple(t.shape)}")
    return t


def _check_order(order: torch.Tensor | np.ndarray | Sequence[int], n: int) -> torch.Tensor:
    o = torch.as_tensor(np.asarray(order), dtype=torch.long)
    if o.shape != (n,) or not torch.equal(torch.sort(o).values, torch.arange(n)):
        raise ValueError(f"order must be a permutation of range({n}), got shape {tuple(o.shape)}")
    return o


def _check_fractions(fractions: Sequence[float]) -> list[float]:
    betas = [float(b) for b in fractions]
    if not betas:
        raise ValueError("fractions must not be empty")
    for b in betas:
        if not 0.0 <= b <= 1.0:
            raise ValueError(f"fractions must lie in [0, 1], got {b!r}")
    return betas


def mixed_gallery(
    old_embeddings: torch.Tensor | np.ndarray,
    new_embeddings: torch.Tensor | np.ndarray,
    order: torch.Tensor | np.ndarray | Sequence[int],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> Iterator[tuple[float, torch.Tensor]]:
    """Yield ``(β, Φ^G_{π,β})`` for each β in ``fractions`` (λ-orth §2.11).

    Shapes: ``old_embeddings`` and ``new_embeddings`` (N, D) in one comparable space (module
    docstring), row i the same item; ``order`` (N,) a permutation of range(N), the backfill order π
    (e.g. ``np.lexsort((ids, -scores))``: priority descending, ties by id). Each yielded gallery is a fresh (N, D) tensor
    whose rows ``order[:⌊β·N⌋]`` come from ``new_embeddings`` and the others from
    ``old_embeddings`` (``⌊·⌋`` as ``policy.budget_count``, the policy's rounding).
    """
    old = _as_tensor(old_embeddings, "old_embeddings")
    new = _as_tensor(new_embeddings, "new_embeddings").to(device=old.device)
    if new.shape != old.shape:
        raise ValueError(f"new_embeddings must have the shape of old_embeddings {tuple(old.shape)}, got {tuple(new.shape)}")
    if new.dtype != old.dtype:
        common = torch.promote_types(old.dtype, new.dtype)
        old, new = old.to(common), new.to(common)
    n = old.shape[0]
    o = _check_order(order, n).to(old.device)
    for beta in _check_fractions(fractions):
        k = budget_count(beta, n)
        gallery = old.clone()
        if k:
            rows = o[:k]
            gallery[rows] = new[rows]
        yield beta, gallery


_CMC = re.compile(r"^(?:cmc@|top)(\d+)$")


def _parse_metric(metric: str) -> int | None:
    """The k of ``cmc@k`` / ``topk``, or None for ``mAP``; ValueError otherwise."""
    name = metric.strip().lower()
    if name in ("map", "mean_ap"):
        return None
    match = _CMC.match(name)
    if match and int(match.group(1)) >= 1:
        return int(match.group(1))
    raise ValueError(f"metric must be 'mAP', 'cmc@k' or 'topk' (k >= 1), got {metric!r}")


def backfill_curve(
    queries: torch.Tensor | np.ndarray,
    old_gallery: torch.Tensor | np.ndarray,
    new_gallery: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray | Sequence[int],
    ids: torch.Tensor | np.ndarray | Sequence[int] | None,
    order: torch.Tensor | np.ndarray | Sequence[int],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    space: str = "euclidean",
    curv: float | torch.Tensor = 1.0,
    metric: str = "cmc@1",
    *,
    query_labels: torch.Tensor | np.ndarray | Sequence[int] | None = None,
    query_ids: torch.Tensor | np.ndarray | Sequence[int] | None = None,
) -> list[tuple[float, float]]:
    """The backfilling curve ``[(β, M(Φ^G_{π,β}, Φ^Q)), ...]`` (λ-orth §2.11).

    Args:
        queries: (N_q, D) query embeddings in the NEW model's (comparable) space.
        old_gallery, new_gallery: (N, D) the gallery's old and new embeddings in that same space
            (see the module docstring for which transforms give one space).
        labels: (N,) gallery class labels.
        ids: (N,) gallery item ids, or None. With ``query_ids`` they enable leave-one-out.
        order: (N,) the backfill order π, a permutation of range(N).
        fractions: the β grid (each in [0, 1]); include 0 and 1 to get an area.
        space, curv: the retrieval space and curvature (``metrics.retrieval_metrics``).
        metric: ``"cmc@k"`` / ``"topk"`` (CMC@k) or ``"mAP"``.
        query_labels: (N_q,) query labels; default ``labels`` (the queries are the gallery items
            themselves, N_q = N).
        query_ids: (N_q,) query ids; default ``ids`` under the same assumption, which makes the
            evaluation leave-one-out (an item never retrieves itself).
    """
    q = _as_tensor(queries, "queries")
    if query_labels is None:
        query_labels = labels
        if query_ids is None:
            query_ids = ids
    if (query_ids is None) != (ids is None):
        raise ValueError("ids and query_ids must be given together (or both None)")
    old = _as_tensor(old_gallery, "old_gallery")
    if q.shape[1] != old.shape[1]:
        raise ValueError(
            f"queries (width {q.shape[1]}) and galleries (width {old.shape[1]}) must be in one comparable space"
        )
    k = _parse_metric(metric)
    curve: list[tuple[float, float]] = []
    for beta, gallery in mixed_gallery(old, new_gallery, order, fractions):
        result = retrieval_metrics(
            q, gallery, query_labels, labels, space, curv=curv, ks=(k or 1,), query_ids=query_ids, gallery_ids=ids
        )
        curve.append((beta, float(result.mean_ap) if k is None else float(result.cmc[k])))
    return curve


def _base_uri(uri: str) -> str:
    for ext in (".csv", ".png"):
        if uri.lower().endswith(ext):
            return uri[: -len(ext)]
    return uri


def write_backfill_curve(
    uri: str,
    curve: Sequence[tuple[float, float]],
    *,
    metric: str = "value",
    title: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the curve as ``<uri>.csv`` and ``<uri>.png`` (each atomically, ``storage.write_bytes_atomic``).

    ``uri`` is a base path (a trailing ``.csv`` / ``.png`` is dropped); local paths and fsspec URIs
    both work. The CSV has a header ``fraction,<metric>`` and one row per point (``repr`` floats,
    so it round-trips exactly). The PNG is drawn with matplotlib's Agg canvas (no pyplot state).

    Returns ``{"csv": uri, "png": uri, "area": M~ or None}``; the area (``backfill_curve_area``)
    is None unless the fractions are sorted and run from 0 to 1.
    """
    points = [(float(b), float(v)) for b, v in curve]
    if not points:
        raise ValueError("curve must have at least one point")
    if not all(math.isfinite(b) for b, _ in points):
        raise ValueError("curve fractions must be finite")
    if not re.fullmatch(r"[A-Za-z0-9_.@-]+", metric):
        raise ValueError(f"metric must be a plain column name, got {metric!r}")
    betas = np.array([b for b, _ in points])
    values = np.array([v for _, v in points])
    area: float | None
    try:
        area = backfill_curve_area(betas, values)
    except ValueError:
        area = None

    base = _base_uri(uri)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["fraction", metric])
    for b, v in points:
        writer.writerow([repr(b), repr(v)])
    csv_uri, png_uri = base + ".csv", base + ".png"
    write_bytes_atomic(csv_uri, buffer.getvalue().encode("utf-8"), storage_options)
    write_bytes_atomic(png_uri, _render_png(betas, values, metric, title, area), storage_options)
    return {"csv": csv_uri, "png": png_uri, "area": area}


def _render_png(betas: np.ndarray, values: np.ndarray, metric: str, title: str | None, area: float | None) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(betas, values, marker="o")
    ax.set_xlabel("fraction re-embedded β")
    ax.set_ylabel(metric)
    ax.set_xlim(0.0, 1.0)
    heading = title or "backfill curve"
    if area is not None:
        heading += f"  (area {area:.4f})"
    ax.set_title(heading)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", metadata={"Software": None})
    return out.getvalue()
