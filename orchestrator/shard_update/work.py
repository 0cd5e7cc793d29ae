"""One shard update from its items to its files: embed the items as they stream in, assemble the
shard, write it (and, for a split, the source shard without the moved items), describe the result.

The items arrive as Arrow blocks with the columns of ``data.gallery_sources`` (``row``, ``id``,
``uri``, ``label``, ``image``, metadata columns); ``embed`` turns a block's rows into
(embedding (B, D) float32, uncertainty (B,) float32), and ``embedded_part`` puts them beside the
block's other columns. ``finish_shard_update`` turns the embedded parts of one update into its
files. Whatever runs these (a Ray Data stage, a test, a plain loop) holds one shard's embeddings
at a time, never the gallery; none of it imports Ray.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from orchestrator.gallery.shard_files import ShardEmbeddings, all_distinct, read_shard
from orchestrator.shard_update.files import ShardTarget, WrittenShard, write_shard_files
from orchestrator.shard_update.update import ShardUpdate, UpdateKind

EmbedBlock = Callable[[pa.Table], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class ShardUpdateResult:
    """What a shard update hands back: the shard files written (one; a split: the kept shard and
    the new one, in that order), where and when it ran (``timing``: ``started``, ``first_batch``,
    ``finished`` as Unix times, ``node``; seconds spent waiting for blocks ``read_s``, decoding
    and embedding ``embed_s``, assembling, writing and indexing ``write_s``)."""

    key: str
    written: tuple[WrittenShard, ...]
    timing: dict[str, Any] = field(default_factory=dict)

    @property
    def n_items(self) -> int:
        """Items embedded (the new generation's shard)."""
        return self.written[-1].n_items


def run_shard_update(update: ShardUpdate, blocks: Iterable[pa.Table], embed: EmbedBlock, generation: str,
                     space: str, curv: float, target: ShardTarget, batch_size: int,
                     node: str = "") -> ShardUpdateResult:
    """One shard update in this process: embed the items of ``update`` streamed as ``blocks`` in
    batches of ``batch_size`` (``embedded_part``), then ``finish_shard_update``. The gallery step
    runs the same two functions in its Ray Data stages (``orchestrator.distributed.gallery_step``)."""
    started = time.time()
    parts = [embedded_part(piece, *embed(piece)) for block in blocks
             for piece in (block.slice(start, batch_size) for start in range(0, len(block), batch_size))]
    return finish_shard_update(update, parts, generation, space, curv, target, node=node, started=started)


def embedded_part(block: pa.Table, embedding: np.ndarray, uncertainty: np.ndarray) -> pa.Table:
    """A block of items (``data.gallery_sources`` columns) with its embeddings: the block without
    ``image``, plus ``embedding`` (fixed-size lists of D float32, from (B, D)) and ``uncertainty``
    (B,) float32. Every other column (``row``, ``id``, ``label``, ``uri``, metadata, ``entry``) is
    kept as it came."""
    embedding = np.ascontiguousarray(embedding, dtype=np.float32)
    if embedding.ndim != 2 or embedding.shape[0] != len(block):
        raise ValueError(f"embedding of shape {embedding.shape} for a block of {len(block)} items")
    kept = block.drop_columns(["image"]) if "image" in block.column_names else block
    return (kept.append_column("embedding", pa.FixedSizeListArray.from_arrays(pa.array(embedding.reshape(-1)),
                                                                             embedding.shape[1]))
            .append_column("uncertainty", pa.array(np.asarray(uncertainty, dtype=np.float32))))


def finish_shard_update(update: ShardUpdate, parts: Sequence[pa.Table], generation: str, space: str, curv: float,
                        target: ShardTarget, node: str = "", started: float | None = None) -> ShardUpdateResult:
    """The embedded rows of ``update`` (``embedded_part`` tables, any order; an item a retried part
    repeats counts once) → its shard files written (a split: the source shard without the moved
    items too), described in a ``ShardUpdateResult``; RuntimeError unless they are exactly the
    planned items (``assemble_shard``)."""
    clock, began = time.perf_counter(), time.time()
    shard = assemble_shard(update, parts, generation, space, curv)
    if update.kind is UpdateKind.EMBED:
        written: tuple[WrittenShard, ...] = (write_shard_files(update.shard, shard, target, update.key,
                                                               update.first_attempt),)
    else:
        source = read_shard(update.source[0], expected_sha256=update.source[1], storage_options=target.storage_options)
        kept = source.without(shard.ids)
        if len(kept) != len(source) - len(shard):
            raise RuntimeError(f"{update.key}: shard {update.shard} does not hold all the {len(shard)} items the "
                               "plan moves")
        written = (write_shard_files(update.shard, kept, target, update.key, update.first_attempt),
                   write_shard_files(update.target, shard, target, update.key, update.first_attempt))
    return ShardUpdateResult(update.key, written, {"started": started or began, "finished": time.time(), "node": node,
                                                   "write_s": round(time.perf_counter() - clock, 6)})


_PART_COLUMNS = ("id", "row", "label", "embedding", "uncertainty", "entry")


def assemble_shard(update: ShardUpdate, parts: Sequence[pa.Table], generation: str, space: str,
                   curv: float) -> ShardEmbeddings:
    """The embedded rows of ``update`` (in arrival order; an (id, row) pair repeated counts once) →
    its ``ShardEmbeddings``, sorted by id, its attributes the parts' ``uri`` and metadata columns;
    RuntimeError unless they are exactly the planned items: ``num_items`` distinct ids, and the
    planned row range when there is one."""
    if not parts:
        raise RuntimeError(f"{update.key}: no embedded item, {update.num_items} planned")
    table = pa.concat_tables(parts, promote_options="default").combine_chunks()
    ids, rows = table.column("id").to_numpy().astype(np.int64), table.column("row").to_numpy().astype(np.int64)
    first = _first_occurrences(ids, rows)
    kept = np.arange(ids.size) if first is None else first
    by_id = kept[np.argsort(ids[kept], kind="stable")]  # the shard's order: sorted by id
    ids, rows = ids[by_id], rows[by_id]
    planned = update.rows is None or np.array_equal(np.sort(rows), np.arange(*update.rows))
    if ids.size != update.num_items or not all_distinct(ids) or not planned:
        raise RuntimeError(f"{update.key}: the embedded items are not exactly the planned ones ({ids.size} rows, "
                           f"{np.unique(ids).size} distinct ids, {update.num_items} planned)")
    table = table.take(pa.array(by_id))
    embedding = table.column("embedding").combine_chunks()
    embeddings = embedding.values.to_numpy().reshape(len(table), embedding.type.list_size)
    attributes = table.drop_columns([c for c in _PART_COLUMNS if c in table.column_names])
    return ShardEmbeddings(ids, table.column("label").to_numpy().astype(np.int64),
                           embeddings.astype(np.float32, copy=False),
                           table.column("uncertainty").to_numpy().astype(np.float32), generation, space, curv, rows,
                           attributes)


def _first_occurrences(ids: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
    """Positions of the first occurrence of each distinct (id, row) pair, in arrival order, or None
    when every pair occurs once: a part that a retried task reported twice repeats the same items
    (the same ids at the same rows); an id at two rows stays twice, and is refused. Rows that are
    all distinct (every step without a retry) make every pair distinct: one sort of the rows (already
    in order: a scan) decides it, where the pairs' own ``np.unique(axis=0)`` costs ~0.5 µs per item."""
    ordered = np.sort(rows)
    if not np.any(ordered[1:] == ordered[:-1]):
        return None
    _unique, first = np.unique(np.stack([ids, rows], axis=1), axis=0, return_index=True)
    return np.sort(first)
