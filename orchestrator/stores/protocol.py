"""The gallery store protocol: where a gallery's searched vectors live (docs/stores.md).

A store is what the gallery step's workers write a shard update into, what the router searches,
what ``verify`` checks, what ``gc`` collects and what a rollback serves again. The lineage stays
the one authority on what is served: a shard row names the store *location* of its rows (its
``index_uri``; ``stores.locations``) together with their record (row count, digest; the
``integrity:<location>`` step), and only rows a lineage row, a recorded deployment or a running
server names are ever searched. Whatever a store holds besides (rows of an update that never
committed) is *staged*: no query reaches it, ``verify`` lists it, ``gc`` removes it.

Implementations: ``stores.files.ShardFileStore`` (a FAISS index file per shard, the default),
``stores.pgvector.PgVectorStore`` and ``stores.lance.LanceStore``; the last two hold rows
(``RowStore``: a location's row count and columns, and the columns ``stores.migrate`` adds). A store
object is small and picklable (a spec, no live connection): it travels to Ray workers and opens its
connection there. What ``open_shard`` returns is an ``index.protocol.ShardSearch``, as an index
file's index is.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from orchestrator.index.protocol import ShardSearch

if TYPE_CHECKING:
    from orchestrator.gallery.shard_files import ShardEmbeddings


@runtime_checkable
class GalleryStore(Protocol):
    """What the gallery step, the router, ``serve``, ``verify``, ``gc`` and rollback ask of a store."""

    kind: str

    def describe(self) -> str:
        """Where the store is, as it may be printed (no password)."""

    def check_reachable(self) -> None:
        """Raise ``StoreUnavailable`` (one line: store, location, what to check) unless it answers."""

    def write_shard(self, shard_index: int, shard: ShardEmbeddings, key: str, first_attempt: bool) -> tuple[str, dict[str, Any]]:
        """Write ``shard`` (``ShardEmbeddings``) as shard ``shard_index``'s rows, staged: nothing a
        query reads. Returns (its location URI, its record: ``sha256`` (the rows' digest),
        ``ids_sha256``, ``n_items``, ``space``, ``curv``, ``dim``). On the first attempt of step
        ``key`` rows already at that location are refused (``UnknownArtefact``); a later attempt
        replaces them. Exactly once: the rows appear all at once or not at all."""

    def open_shard(self, uri: str, record: Mapping[str, Any] | None, n_items: int | None = None) -> ShardSearch:
        """The rows at ``uri`` as a searchable shard; ``IntegrityError`` when their count is not the
        recorded one (or the lineage shard row's ``n_items``)."""

    def check_shard(self, uri: str, record: Mapping[str, Any] | None, n_items: int | None = None) -> None:
        """``IntegrityError`` unless the rows at ``uri`` are the recorded ones (count and digest, and
        ``n_items`` when given); ``FileNotFoundError`` when there are none."""

    def locations(self) -> list[str]:
        """Every shard location the store holds, committed or staged."""

    def remove(self, uris: Iterable[str]) -> None:
        """Remove the rows at ``uris`` (``gc``: locations nothing retained names)."""


@runtime_checkable
class RowStore(GalleryStore, Protocol):
    """A store that holds rows (pgvector, Lance): what a location's rows are, and the columns a
    migration adds (``stores.migrate``)."""

    def count(self, uri: str) -> int:
        """The rows at location ``uri`` (0: none)."""

    def read_rows(self, uri: str, columns: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(ids (N,) int64 ascending, column → its (N, ·) values in that order) of the rows at
        ``uri`` (``stores.vectors.row_columns``: a forward path reads ``raw``, ``verify`` every
        recorded column)."""

    def add_columns(self, name: str, locations: list[tuple[str, np.ndarray, dict[str, np.ndarray]]],
                    space: str, /) -> None:
        """``stores.migrate``: add and fill the columns rows of the earlier layout lack: those
        ``locations`` carry ((location URI, its ids ascending, column → (N, ·) values)), in the
        table / dataset ``name`` (its vectors in ``space``)."""
