"""What a searchable shard is, whoever holds it: the seam between the router and the indexes.

``ShardSearch`` is what the router and the search service ask of a shard: an index file's index
(``ShardIndex``, ``BinaryIndex``, ``PQIndex``) or the rows a vector store opens (``stores``).
``StoredIndex`` adds what an index file's index also does: describe, serialise and save itself
(``factory.build_index`` / ``load_index`` return one). Nothing here imports faiss or torch.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class ShardSearch(Protocol):
    """A searchable shard: its kind (``flat``, ``ivf``, ``binary``…), the width D of its vectors and
    queries, its item count, and the search."""

    kind: str
    dim: int

    @property
    def ntotal(self) -> int: ...

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(Q, D) queries → (distances (Q, k) float64 ascending, ids (Q, k) int64); +inf / −1 = none."""
        ...


@runtime_checkable
class StoredIndex(ShardSearch, Protocol):
    """A shard's index as an index file holds it (``factory``: every kind)."""

    def header(self) -> dict[str, Any]:
        """What the file's header records (kind, space, curvature, dim, count, options)."""
        ...

    def to_bytes(self) -> bytes:
        """The index file's bytes (``factory.index_from_bytes`` reads them back)."""
        ...

    def save(self, uri: str, storage_options: Mapping[str, Any] | None = None) -> None:
        """Write the index file at ``uri``."""
        ...
