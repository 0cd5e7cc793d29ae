"""Ray Data datasource over a gallery source: read tasks that stream the items of shard updates.

Each pending shard update (``shard_update.ShardUpdate``, an *entry* of a gallery plan) becomes one
or more read tasks, and every block a task yields holds rows of that entry only, tagged with an
``entry`` column (the update's position in the list given), so the driver can assemble each update
as its rows arrive. What an entry reads (``update_reads``):

- ``RowRange``: its gallery rows [start, stop) (a shard's first population), split into tasks of at
  most ``rows_per_task`` rows;
- ``StoredItems``: the items of its stored shard file (``source``; its ``row`` column, sha256
  checked in the task), only the ids of its selection file when it has one (a partial backfill's
  choice), read again from the source to be re-embedded by a new generation.

The driver only describes the reads; the files are read inside Ray tasks (on any node), a bounded
block at a time. A ``MemorySource`` (an in-memory data source such as the digits) is put into the
object store once and every task reads it from there.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata

from orchestrator.data.gallery_sources import GallerySource, MemorySource
from orchestrator.gallery.shard_files import read_selection, read_shard
from orchestrator.shard_update.update import ShardUpdate


@dataclass(frozen=True)
class RowRange:
    """Entry ``entry`` reads gallery rows [start, stop)."""

    entry: int
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class StoredItems:
    """Entry ``entry`` reads again the items of the shard file ``shard_uri`` (sha256 ``shard_sha256``),
    only those of the selection file ``selection`` (uri, sha256) when given; ``num_rows`` planned."""

    entry: int
    shard_uri: str
    shard_sha256: str
    selection: tuple[str, str] | None
    num_rows: int


EntryRead = RowRange | StoredItems


def update_reads(updates: Sequence[ShardUpdate]) -> list[EntryRead]:
    """What each of ``updates`` reads, tagged with its position (module docstring)."""
    return [_read(entry, update) for entry, update in enumerate(updates)]


def _read(entry: int, update: ShardUpdate) -> EntryRead:
    if update.rows is not None:
        return RowRange(entry, *update.rows)
    if update.source is None:
        raise ValueError(f"shard update {entry} has neither rows of the source nor a stored shard to read")
    shard_uri, shard_sha256 = update.source
    return StoredItems(entry, shard_uri, shard_sha256, update.selection, update.num_items)


def gallery_dataset(source: GallerySource, updates: Sequence[ShardUpdate], block_rows: int = 1024,
                    rows_per_task: int = 65536):
    """A lazy ``ray.data.Dataset`` of the raw items ``updates`` read (columns of
    ``orchestrator.data.gallery_sources`` plus ``entry``); Ray must be initialised.

    The read keeps Ray Data's default resources, so that Ray Data fuses it into the stage after it:
    the embedding actors (or, with GPUs, the decoding tasks) run the read tasks themselves and the
    items never travel through the object store (a read of its own, with no CPU asked, started a
    worker process per task and moved every image once more; measured on 2 cores, 2-3× slower).
    A row-range task carries only the readers of its fragments; the source itself (its whole
    listing) goes into the object store once, for the tasks that read stored items again and for
    in-memory sources.
    """
    import ray
    import ray.data

    pieces = read_pieces(updates, rows_per_task)
    datasource = _GalleryDatasource(source, ray.put(source) if needs_source_ref(source, pieces) else None,
                                    tuple(pieces), block_rows)
    # one task per piece, its blocks already bounded by block_rows: no further splitting
    return ray.data.read_datasource(datasource, override_num_blocks=max(len(pieces), 1))


def read_pieces(updates: Sequence[ShardUpdate], rows_per_task: int) -> list[EntryRead]:
    """One read task's share of ``updates`` each: a row range split into ranges of at most
    ``rows_per_task`` rows (a task never spans two updates); a stored shard read again whole."""
    return [piece for read in update_reads(updates) for piece in _split(read, rows_per_task)]


def _split(read: EntryRead, rows_per_task: int) -> list[EntryRead]:
    if isinstance(read, StoredItems):
        return [read]
    return [RowRange(read.entry, start, min(start + rows_per_task, read.stop))
            for start in range(read.start, read.stop, rows_per_task)]


class _GalleryDatasource(Datasource):
    def __init__(self, source: GallerySource, source_ref, pieces: tuple[EntryRead, ...], block_rows: int):
        super().__init__()
        self.source, self.source_ref, self.pieces, self.block_rows = source, source_ref, pieces, block_rows

    def get_name(self) -> str:
        return "Gallery"

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context=None):
        return [ReadTask(entry_reader(self.source, self.source_ref, piece, self.block_rows),
                         BlockMetadata(num_rows=piece.num_rows, size_bytes=None, exec_stats=None, input_files=None))
                for piece in self.pieces]


def entry_reader(source: GallerySource, source_ref, read: EntryRead, block_rows: int) -> Callable[[], Iterator[pa.Table]]:
    """A picklable callable yielding the blocks of ``read`` (tagged with its entry) wherever it
    runs: a row range of a file source carries only its fragments' readers; stored items and
    in-memory sources read the source from the object store (``source_ref``, Ray initialised)."""
    if isinstance(read, StoredItems):
        return functools.partial(_read_stored, source_ref, read, block_rows)
    if isinstance(source, MemorySource):
        return functools.partial(_read_range_of, source_ref, read, block_rows)
    readers = [(source.reader(f), lo, hi) for f, lo, hi in source.pieces(read.start, read.stop)]
    return functools.partial(_read_fragments, readers, read.entry, block_rows)


def needs_source_ref(source: GallerySource, reads: Sequence[EntryRead]) -> bool:
    """Whether ``entry_reader`` of these reads needs the source in the object store."""
    return isinstance(source, MemorySource) or any(isinstance(r, StoredItems) for r in reads)


def _tagged(blocks: Iterator[pa.Table], entry: int) -> Iterator[pa.Table]:
    for block in blocks:
        yield block.append_column("entry", pa.array(np.full(len(block), entry, dtype=np.int64)))


def _read_fragments(readers: list, entry: int, block_rows: int) -> Iterator[pa.Table]:
    """A row-range task: local rows [lo, hi) of each of its fragments (runs in a Ray task)."""
    yield from _tagged((block for reader, lo, hi in readers for block in reader.blocks(lo, hi, None, block_rows)), entry)


def _read_range_of(source_ref, read: RowRange, block_rows: int) -> Iterator[pa.Table]:
    """A row-range task over a source kept in the object store (in-memory sources)."""
    import ray

    source = ray.get(source_ref)
    yield from _tagged((block for fragment, lo, hi in source.pieces(read.start, read.stop)
                        for block in source.reader(fragment).blocks(lo, hi, None, block_rows)), read.entry)


def _read_stored(source_ref, read: StoredItems, block_rows: int) -> Iterator[pa.Table]:
    """A task reading a stored shard's items again (runs in a Ray task)."""
    import ray

    source = ray.get(source_ref)
    yield from _tagged(source.read_rows(_stored_rows(source, read), block_rows), read.entry)


def _stored_rows(source: GallerySource, read: StoredItems) -> np.ndarray:
    """The gallery rows of the items to read again: the shard's (or the selection's) items."""
    shard = read_shard(read.shard_uri, read.shard_sha256)  # checked against the hash the lineage recorded
    ids, rows = shard.ids, shard.rows
    if rows is None:  # a shard written before rows were recorded: only an in-memory source can map ids
        if not isinstance(source, MemorySource):
            raise ValueError(f"{read.shard_uri}: the shard file has no row column; re-embed the gallery")
        rows = source.rows_of(ids)
    if read.selection is not None:
        rows = rows[np.isin(ids, read_selection(*read.selection))]
    if rows.size != read.num_rows:
        raise RuntimeError(f"{read.shard_uri}: {rows.size} items to read again, the plan says {read.num_rows}")
    return rows
