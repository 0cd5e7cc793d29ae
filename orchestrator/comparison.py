"""How a query generation's embeddings are compared with a gallery generation's embeddings.

One rule set, shared by the compatibility evaluation, the mixed-gallery evaluation and search:

- ``same``: the query generation is the gallery generation.
- ``adapter``: the gallery generation is an ancestor of the query generation and every
  generation on the way down (the query generation, its parent, …, excluding the gallery
  generation) carries a ``backward`` adapter B (λ-orthogonality, lambda_orthogonality.md §2.10,
  row B(φ_new)/φ_old). Queries are mapped by the chain B_parent∘…∘B_query into the gallery
  generation's space, then both sides keep the first min(widths) coordinates
  (``truncate_to_common``, §2.8). Decision: for an ancestor two or more updates back the adapters
  are chained; each B_t was fitted to map φ_t into φ_{t−1}'s space, so the chain lands in the
  ancestor's space (the paper evaluates one step only).
- ``direct``: both generations embed into the same space (same kind and, for hyperbolic spaces,
  the same curvature): compatible-by-training methods (BCT, HBCT, d-Simplex, …) compare raw
  embeddings with the gallery generation's distance.

Anything else raises ``IncomparableGenerations`` naming both generations and the reason, so a
caller can refuse instead of returning meaningless distances.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from orchestrator.geometry.spaces import Space
from orchestrator.models.adapters import truncate_to_common
from orchestrator.models.bundle import CompatibleModel

BACKWARD_ADAPTER = "backward"


class IncomparableGenerations(ValueError):
    """No meaningful distance exists between two generations' embeddings (``reason`` says why)."""

    def __init__(self, query: str, gallery: str, reason: str):
        super().__init__(f"generation {query!r} cannot search generation {gallery!r}'s embeddings: {reason}")
        self.query, self.gallery, self.reason = query, gallery, reason


@dataclass(frozen=True)
class ComparisonPath:
    """How queries of ``query`` are compared with the gallery embeddings of ``gallery``.

    kind:     ``same`` | ``direct`` | ``adapter`` (module docstring).
    space, curv: the space (and curvature magnitude) the distance is measured in: the gallery's.
    adapters: the backward adapters applied to the queries, first to last (``adapter`` only).
    """

    query: str
    gallery: str
    kind: Literal["same", "direct", "adapter"]
    space: Space
    curv: float
    adapters: tuple[nn.Module, ...] = ()

    @property
    def note(self) -> str:
        if self.kind == "adapter":
            hops = "adapter" if len(self.adapters) == 1 else f"chain of {len(self.adapters)} adapters"
            return f"queries mapped by the backward {hops}"
        return self.kind

    @torch.no_grad()
    def _adapted(self, queries: torch.Tensor) -> torch.Tensor:
        """(N_q, D_q) → the queries mapped by the backward adapter chain (``adapter`` paths)."""
        mapped = queries
        for adapter in self.adapters:
            parameter = next(adapter.parameters(), None)
            device = parameter.device if parameter is not None else mapped.device
            mapped = adapter(mapped.to(device))
        return mapped.to(queries.device)

    @torch.no_grad()
    def align(self, queries: torch.Tensor, gallery: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N_q, D_q) query embeddings of ``query`` and (N_g, D_g) gallery embeddings of
        ``gallery`` → both in the gallery's space with one width. IncomparableGenerations when the
        widths differ on a path that does not truncate."""
        if self.kind == "adapter":
            return truncate_to_common(self._adapted(queries).to(gallery.device), gallery)
        if queries.shape[-1] != gallery.shape[-1]:
            raise IncomparableGenerations(self.query, self.gallery,
                                          f"no common distance: dimensions {queries.shape[-1]} vs {gallery.shape[-1]}")
        return queries, gallery

    @torch.no_grad()
    def map_queries(self, queries: torch.Tensor, gallery_dim: int) -> torch.Tensor:
        """(N_q, D_q) queries of ``query`` → (N_q, gallery_dim) queries to search an index that
        stores the gallery's embeddings at full width ``gallery_dim``: as ``align``, except that
        the gallery side cannot be truncated, so an adapter path whose mapped queries are
        narrower than the gallery raises IncomparableGenerations."""
        if self.kind == "adapter":
            mapped = self._adapted(queries)
            if mapped.shape[-1] < gallery_dim:
                raise IncomparableGenerations(
                    self.query, self.gallery, f"the adapted queries have {mapped.shape[-1]} coordinates but the "
                    f"gallery's index holds {gallery_dim}; comparing a common prefix would need a truncated index")
            return mapped[..., :gallery_dim]
        if queries.shape[-1] != gallery_dim:
            raise IncomparableGenerations(self.query, self.gallery,
                                          f"no common distance: dimensions {queries.shape[-1]} vs {gallery_dim}")
        return queries


def comparison_path(query: str, gallery: str, models: Mapping[str, CompatibleModel],
                    parents: Mapping[str, str | None]) -> ComparisonPath:
    """The path from ``query``'s embeddings to ``gallery``'s (module docstring).

    models:  generation name → model; needs ``query``, ``gallery`` and, on an adapter path, every
             generation between them.
    parents: generation name → parent name (None for a root).
    """
    for name in (query, gallery):
        if name not in models:
            raise KeyError(f"no model given for generation {name!r}")
    gallery_model = models[gallery]
    if query == gallery:
        return ComparisonPath(query, gallery, "same", gallery_model.space, gallery_model.curv)
    chain = _backward_chain(query, gallery, models, parents)
    if chain is not None:
        return ComparisonPath(query, gallery, "adapter", gallery_model.space, gallery_model.curv, chain)
    query_model = models[query]
    if query_model.space != gallery_model.space or (
        query_model.space in (Space.LORENTZ, Space.POINCARE) and not math.isclose(query_model.curv, gallery_model.curv)
    ):
        raise IncomparableGenerations(
            query, gallery, f"no common distance: {query_model.space.value}(K={query_model.curv:g}) vs "
            f"{gallery_model.space.value}(K={gallery_model.curv:g})")
    return ComparisonPath(query, gallery, "direct", gallery_model.space, gallery_model.curv)


def _backward_chain(query: str, gallery: str, models: Mapping[str, CompatibleModel],
                    parents: Mapping[str, str | None]) -> tuple[nn.Module, ...] | None:
    """The backward adapters from ``query`` down to its ancestor ``gallery``, or None when
    ``gallery`` is not an ancestor or a generation on the way has no backward adapter."""
    chain: list[nn.Module] = []
    current: str | None = query
    seen: set[str] = set()
    while current is not None and current != gallery:
        if current in seen or current not in models:
            return None
        seen.add(current)
        adapters = models[current].adapters
        if BACKWARD_ADAPTER not in adapters:
            return None
        chain.append(adapters[BACKWARD_ADAPTER])
        current = parents.get(current)
    return tuple(chain) if current == gallery and chain else None
