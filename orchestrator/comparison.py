"""How a query generation's embeddings are compared with a gallery generation's embeddings.

One rule set, shared by the compatibility evaluation, the mixed-gallery evaluation and search,
tried in this order:

- ``same``: the query generation is the gallery generation.
- ``adapter``: the gallery generation is an ancestor of the query generation and every
  generation on the way down (the query generation, its parent, …, excluding the gallery
  generation) carries a ``backward`` adapter B (λ-orthogonality, lambda_orthogonality.md §2.10,
  row B(φ_new)/φ_old). Queries are mapped by the chain B_parent∘…∘B_query into the gallery
  generation's space, then both sides keep the first min(widths) coordinates
  (``truncate_to_common``, §2.8). Decision: for an ancestor two or more updates back the adapters
  are chained; each B_t was fitted to map φ_t into φ_{t−1}'s space, so the chain lands in the
  ancestor's space (the paper evaluates one step only). An adapter that needs its target
  generation's embedding of the query as well (``needs_target_queries``: the spherical
  interpolation of ``orchestrator.methods.posthoc.Slerp``) is handed it from
  ``queries_by_generation`` (``ComparisonPath.query_generations`` names whose it needs); the
  gallery side is untouched.
- ``forward``: the gallery generation is an ancestor of the query generation and every generation
  on the way down (query generation included, gallery generation excluded) carries a forward map
  F and NO backward adapter (FCT: trained independently, then F: φ_{t−1} → φ_t fitted by MSE).
  The GALLERY embeddings are mapped by the chain F_query∘…∘F_{gallery+1} into the query
  generation's space and compared there with the raw queries (row F(φ_old)/φ_new), with the query
  generation's distance. Decision: an ancestor two or more updates back is reached by chaining
  the F's (each F_t maps its parent's raw space into its own, so the composition lands in the
  query's space); a chain through a generation without a lone forward map (a BCT or λ-orth
  generation in between) is not formed.
- ``direct``: both generations embed into the same space (same kind and, for hyperbolic spaces,
  the same curvature): compatible-by-training methods (BCT, HBCT, d-Simplex, …) compare raw
  embeddings with the gallery generation's distance. Refused when a generation trained apart from
  its parent lies between the two in the lineage (on either side, below their nearest common
  ancestor; both whole ancestries when they share none): one with a lone forward map (FCT) or a
  post-hoc one, whose given encoder reaches its parent through a ``ChartMap`` only
  (``orchestrator.methods.posthoc``); raw embeddings across it share no space (φ_new/φ_old of FCT
  is refused, not computed). Generations missing from ``models`` are not inspected.

Anything else raises ``IncomparableGenerations`` naming both generations and the reason, so a
caller can refuse instead of returning meaningless distances.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from orchestrator.errors import UsageError
from orchestrator.geometry.spaces import Space
from orchestrator.models.adapters import (
    BACKWARD_ADAPTER,
    FORWARD_ADAPTER,
    ChartMap,
    QueryInterpolation,
    truncate_to_common,
)
from orchestrator.models.bundle import CompatibleModel


class IncomparableGenerations(UsageError, ValueError):
    """No meaningful distance exists between two generations' embeddings (``reason`` says why)."""

    def __init__(self, query: str, gallery: str, reason: str):
        super().__init__(f"generation {query!r} cannot search generation {gallery!r}'s embeddings: {reason}")
        self.query, self.gallery, self.reason = query, gallery, reason


class MissingQueryEmbeddings(UsageError, ValueError):
    """A path whose adapter interpolates with ``needed``'s embedding of the queries was not given a
    usable one (``detail`` says what was wrong)."""

    def __init__(self, query: str, gallery: str, needed: str, detail: str):
        super().__init__(f"generation {query!r} searches generation {gallery!r}'s embeddings by interpolating with "
                         f"generation {needed!r}'s embeddings of the same queries: {detail}")
        self.query, self.gallery, self.needed, self.detail = query, gallery, needed, detail



@dataclass(frozen=True)
class ComparisonPath:
    """How queries of ``query`` are compared with the gallery embeddings of ``gallery``.

    kind:     ``same`` | ``direct`` | ``adapter`` | ``forward`` (module docstring).
    space, curv: the space (and curvature magnitude) the distance is measured in: the gallery's,
              except on a ``forward`` path, where it is the query's (the gallery is mapped there).
    adapters: the backward adapters applied to the queries, first to last (``adapter`` only).
    hops:     the generation each of ``adapters`` maps into (its parent), in the same order.
    gallery_maps: the forward maps applied to the gallery, first to last, i.e. F_{gallery+1} …
              F_query (``forward`` only).
    """

    query: str
    gallery: str
    kind: Literal["same", "direct", "adapter", "forward"]
    space: Space
    curv: float
    adapters: tuple[nn.Module, ...] = ()
    gallery_maps: tuple[nn.Module, ...] = ()
    hops: tuple[str, ...] = ()

    @property
    def query_generations(self) -> tuple[str, ...]:
        """The generations whose embeddings of the same queries this path needs besides the query
        generation's: the target of every adapter that interpolates with its target's query
        (``needs_target_queries``); empty on every other path."""
        return tuple(hop for module, hop in zip(self.adapters, self.hops)
                     if getattr(module, "needs_target_queries", False))

    @property
    def note(self) -> str:
        if self.kind == "adapter":
            hops = "adapter" if len(self.adapters) == 1 else f"chain of {len(self.adapters)} adapters"
            if self.query_generations:
                return (f"queries mapped by the backward {hops}, interpolated with "
                        f"{', '.join(self.query_generations)}'s embeddings of them (slerp)")
            return f"queries mapped by the backward {hops}"
        if self.kind == "forward":
            hops = "map F" if len(self.gallery_maps) == 1 else f"chain of {len(self.gallery_maps)} maps F"
            return f"gallery mapped by the forward {hops}"
        return self.kind

    @property
    def maps_gallery(self) -> bool:
        """True when the gallery side must be transformed (``forward``): a stored index of the
        gallery's raw embeddings cannot be searched, only one built over ``map_gallery`` of them."""
        return self.kind == "forward"

    @staticmethod
    @torch.no_grad()
    def _chain(maps: tuple[nn.Module, ...], vectors: torch.Tensor) -> torch.Tensor:
        """Apply ``maps`` first to last, each on its own device and in its own floating dtype (a
        float32 shard file through a float64-fitted F); the result on ``vectors``' device."""
        mapped = vectors
        for module in maps:
            parameter = next(module.parameters(), None)
            if parameter is not None:
                mapped = mapped.to(device=parameter.device, dtype=parameter.dtype)
            mapped = module(mapped)
        return mapped.to(vectors.device)

    @torch.no_grad()
    def _adapted(self, queries: torch.Tensor,
                 queries_by_generation: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        """(N_q, D_q) → the queries mapped by the backward adapter chain (``adapter`` paths); an
        adapter that ``needs_target_queries`` also gets its target generation's (N_q, D_target)
        embeddings of the same queries from ``queries_by_generation`` (``check_query_generations``)."""
        if not self.query_generations:
            return self._chain(self.adapters, queries)
        given = self.check_query_generations(queries, queries_by_generation)
        mapped = queries
        for module, hop in zip(self.adapters, self.hops):
            if getattr(module, "needs_target_queries", False):
                parameter = next(module.parameters(), None)
                if parameter is not None:
                    mapped = mapped.to(device=parameter.device, dtype=parameter.dtype)
                aligned = module.align(mapped)
                if aligned.shape[-1] != given[hop].shape[-1]:
                    raise MissingQueryEmbeddings(self.query, self.gallery, hop, f"they have {given[hop].shape[-1]} "
                                                 f"values per query; generation {hop!r} embeds {aligned.shape[-1]}")
                mapped = module(mapped, given[hop].to(device=mapped.device, dtype=mapped.dtype))
            else:
                mapped = self._chain((module,), mapped)
        return mapped.to(queries.device)

    def check_query_generations(self, queries: torch.Tensor,
                                queries_by_generation: Mapping[str, torch.Tensor | np.ndarray] | None
                                ) -> dict[str, torch.Tensor]:
        """The embeddings of the (N_q, ·) ``queries`` by each of ``query_generations``, taken from
        ``queries_by_generation`` (generation → (N_q, D) embeddings of the same queries);
        ``MissingQueryEmbeddings`` naming the generation when one is absent or is not one row per
        query (a wrong width is refused where the adapter meets it, ``_adapted``)."""
        given: dict[str, torch.Tensor] = {}
        for hop in self.query_generations:
            found = None if queries_by_generation is None else queries_by_generation.get(hop)
            if found is None:
                raise MissingQueryEmbeddings(self.query, self.gallery, hop, "none were given")
            found = torch.as_tensor(found)
            if found.ndim != 2 or found.shape[0] != queries.shape[0]:
                raise MissingQueryEmbeddings(self.query, self.gallery, hop, f"got shape {tuple(found.shape)}, "
                                             f"expected one row per query ({queries.shape[0]})")
            given[hop] = found
        return given

    @torch.no_grad()
    def map_gallery(self, gallery: torch.Tensor) -> torch.Tensor:
        """(N_g, D_g) gallery embeddings of ``gallery`` → where the distance is measured: on a
        ``forward`` path F_query(…F_{gallery+1}(h)) (N_g, D_q), in the query's space (row
        F(φ_old)/φ_new); on every other path the embeddings unchanged."""
        if self.kind != "forward":
            return gallery
        return self._chain(self.gallery_maps, gallery)

    @torch.no_grad()
    def align(self, queries: torch.Tensor, gallery: torch.Tensor,
              queries_by_generation: Mapping[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(N_q, D_q) query embeddings of ``query`` and (N_g, D_g) gallery embeddings of
        ``gallery`` → both in the space the distance is measured in, with one width: the
        gallery's (queries mapped by B on an ``adapter`` path, prefix-truncated), or the query's
        on a ``forward`` path (gallery mapped by F). IncomparableGenerations when the widths
        differ on a path that does not truncate. The mapped side takes the other side's dtype.
        ``queries_by_generation``: the same queries embedded by the ``query_generations``."""
        if self.kind == "adapter":
            adapted = self._adapted(queries, queries_by_generation)
            return truncate_to_common(adapted.to(device=gallery.device, dtype=gallery.dtype), gallery)
        gallery = self.map_gallery(gallery).to(device=queries.device, dtype=queries.dtype)
        if queries.shape[-1] != gallery.shape[-1]:
            raise IncomparableGenerations(self.query, self.gallery,
                                          f"no common distance: dimensions {queries.shape[-1]} vs {gallery.shape[-1]}")
        return queries, gallery

    @torch.no_grad()
    def map_queries(self, queries: torch.Tensor, gallery_dim: int,
                    queries_by_generation: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        """(N_q, D_q) queries of ``query`` → (N_q, gallery_dim) queries to search an index of
        width ``gallery_dim``: one over the gallery's stored embeddings at full width, or, on a
        ``forward`` path, one over ``map_gallery`` of them (the queries are then unchanged). As
        ``align``, except that the gallery side cannot be truncated, so an adapter path whose
        mapped queries are narrower than the gallery raises IncomparableGenerations.
        ``queries_by_generation``: the same queries embedded by the ``query_generations``."""
        if self.kind == "adapter":
            mapped = self._adapted(queries, queries_by_generation)
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

    models:  generation name → model; needs ``query``, ``gallery`` and, on an adapter or forward
             path, every generation between them.
    parents: generation name → parent name (None for a root).
    """
    for name in (query, gallery):
        if name not in models:
            raise KeyError(f"no model given for generation {name!r}")
    gallery_model, query_model = models[gallery], models[query]
    if query == gallery:
        return ComparisonPath(query, gallery, "same", gallery_model.space, gallery_model.curv)
    chain = _backward_chain(query, gallery, models, parents)
    if chain is not None:
        hops = tuple(parents[name] or "" for name in _descent(query, gallery, parents) or ())
        return ComparisonPath(query, gallery, "adapter", gallery_model.space, gallery_model.curv, chain, hops=hops)
    forward = _forward_chain(query, gallery, models, parents)
    if forward is not None:
        return ComparisonPath(query, gallery, "forward", query_model.space, query_model.curv, gallery_maps=forward)
    if query_model.space != gallery_model.space or (
        query_model.space.hyperbolic and not math.isclose(query_model.curv, gallery_model.curv)
    ):
        raise IncomparableGenerations(
            query, gallery, f"no common distance: {query_model.space.value}(K={query_model.curv:g}) vs "
            f"{gallery_model.space.value}(K={gallery_model.curv:g})")
    independent = _independent_between(query, gallery, models, parents)
    if independent is not None:
        raise IncomparableGenerations(
            query, gallery, f"no common space: generation {independent!r} was trained independently of its parent "
            "(it has only a forward map F, e.g. fct, or a post-hoc map B to its parent), so raw embeddings on either "
            "side of it are not comparable; only through its map is it searchable")
    return ComparisonPath(query, gallery, "direct", gallery_model.space, gallery_model.curv)


def query_generations_of(query: str, models: Mapping[str, CompatibleModel],
                         parents: Mapping[str, str | None]) -> tuple[str, ...]:
    """The generations whose embeddings of ``query``'s queries some adapter path from ``query`` to
    an ancestor needs (``ComparisonPath.query_generations``): the parent of every generation on its
    chain of backward adapters whose adapter interpolates with its target's query; usually none."""
    needed: list[str] = []
    seen, current = {query}, query
    while True:
        parent, model = parents.get(current), models.get(current)
        if parent is None or model is None or BACKWARD_ADAPTER not in model.adapters or parent in seen:
            break
        if getattr(model.adapters[BACKWARD_ADAPTER], "needs_target_queries", False):
            needed.append(parent)
        seen.add(parent)
        current = parent
    return tuple(needed)


def has_lone_forward_map(model: CompatibleModel) -> bool:
    """Whether ``model`` carries a forward map F and no backward adapter: a generation trained
    independently of its parent and reachable from it through F only (FCT)."""
    return FORWARD_ADAPTER in model.adapters and BACKWARD_ADAPTER not in model.adapters


def trained_apart_from_parent(model: CompatibleModel) -> bool:
    """Whether ``model``'s encoder was trained without its parent and reaches it through a map only:
    a lone forward map F (FCT) or a post-hoc backward ``ChartMap`` or ``QueryInterpolation`` (a given encoder)."""
    backward = model.adapters[BACKWARD_ADAPTER] if BACKWARD_ADAPTER in model.adapters else None
    return has_lone_forward_map(model) or isinstance(backward, (ChartMap, QueryInterpolation))


def _ancestry(name: str, parents: Mapping[str, str | None]) -> list[str]:
    """``name``, its parent, grandparent, … (stops at a root or a cycle)."""
    line, current = [], name
    while current is not None and current not in line:
        line.append(current)
        current = parents.get(current)
    return line


def _descent(query: str, gallery: str, parents: Mapping[str, str | None]) -> list[str] | None:
    """The generations from ``query`` up to, excluding, its ancestor ``gallery``; None when
    ``gallery`` is not an ancestor of ``query``."""
    line = _ancestry(query, parents)
    return line[:line.index(gallery)] if gallery in line else None


def _backward_chain(query: str, gallery: str, models: Mapping[str, CompatibleModel],
                    parents: Mapping[str, str | None]) -> tuple[nn.Module, ...] | None:
    """The backward adapters from ``query`` down to its ancestor ``gallery``, or None when
    ``gallery`` is not an ancestor or a generation on the way has no backward adapter."""
    descent = _descent(query, gallery, parents)
    if not descent or any(name not in models or BACKWARD_ADAPTER not in models[name].adapters for name in descent):
        return None
    return tuple(models[name].adapters[BACKWARD_ADAPTER] for name in descent)


def _forward_chain(query: str, gallery: str, models: Mapping[str, CompatibleModel],
                   parents: Mapping[str, str | None]) -> tuple[nn.Module, ...] | None:
    """The forward maps to apply to ``gallery``'s embeddings, first (F of the generation just
    below ``gallery``) to last (F of ``query``), or None when ``gallery`` is not an ancestor of
    ``query`` or a generation on the way lacks a lone forward map."""
    descent = _descent(query, gallery, parents)
    if not descent or any(name not in models or not has_lone_forward_map(models[name]) for name in descent):
        return None
    return tuple(models[name].adapters[FORWARD_ADAPTER] for name in reversed(descent))


def _independent_between(query: str, gallery: str, models: Mapping[str, CompatibleModel],
                         parents: Mapping[str, str | None]) -> str | None:
    """A generation trained apart from its parent (``trained_apart_from_parent``) between ``query`` and ``gallery`` in the lineage (below
    their nearest common ancestor, on either side; every generation of both ancestries when they
    share none), or None. Generations not in ``models`` are not inspected."""
    query_line, gallery_line = _ancestry(query, parents), _ancestry(gallery, parents)
    common = next((name for name in query_line if name in gallery_line), None)
    between = [name for line in (query_line, gallery_line)
               for name in (line[:line.index(common)] if common is not None else line)]
    return next((name for name in between if name in models and trained_apart_from_parent(models[name])), None)
