"""The service interface a server's snapshot answers through, written down once.

Two classes implement it: ``search.service.SearchService`` (the router in this process: the
single-process server, ``serving.local``) and ``serving.pooled.PooledService`` (the encoder and
shard-search replicas, over deployment handles). The endpoint (``serving.endpoint``) and the
snapshots (``serving.snapshots``) use nothing else of either.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:  # the interface names them; importing it loads neither
    import numpy as np
    import torch

    from orchestrator.serving.snapshots import LineageState


class SnapshotService(Protocol):
    """What answers the requests of one snapshot for one searching generation."""

    @property
    def serving(self) -> str:
        """The generation whose queries are searched."""
        ...

    @property
    def width(self) -> int:
        """D, the width of that generation's embeddings (what an ``embeddings`` request must give)."""
        ...

    @property
    def query_generations(self) -> tuple[str, ...]:
        """The generations whose embeddings of a query a search needs besides the serving one's
        (spherical interpolation paths, ``search.router.RoutePlan.query_generations``); usually none."""
        ...

    def width_of(self, generation: str) -> int:
        """The width of one of ``query_generations``' embeddings."""
        ...

    def encode(self, images: np.ndarray, generation: str | None = None) -> torch.Tensor:
        """(N, H, W, 3) uint8 images → (N, D) embeddings of the serving generation (or of
        ``generation``, one of ``query_generations``)."""
        ...

    def answer(self, embeddings: torch.Tensor | np.ndarray, k: int,
               queries_by_generation: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
        """The answer document (``search.service.answer_document``) of the (Q, D) serving-generation
        ``embeddings``' top-``k`` (``queries_by_generation``: the same queries by each of
        ``query_generations``): ``{"serving", "paths", "searched_items", "not_searched", "results"}``,
        ``results`` one list of hits per query, in the order of the rows."""
        ...


#: (lineage state, searching generation) → the ``SnapshotService`` of that generation over that
#: state, loaded completely before it answers (``serving.local.LocalServices.build``,
#: ``serving.pooled.PooledServices.build``).
BuildService: TypeAlias = Callable[["LineageState", str], SnapshotService]
