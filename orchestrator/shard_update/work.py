"""One shard update from its items to its files: embed the items as they stream in, assemble the
shard, write it (and, for a split, the source shard without the moved items), describe the result.

The items arrive as Arrow blocks with the columns of ``data.gallery_sources`` (``row``, ``id``,
``uri``, ``label``, ``image``, metadata columns); ``embed`` turns a block's rows into
(embedding (B, D) float32, uncertainty (B,) float32). Whatever runs this (a Ray worker, a test)
holds one shard's embeddings at a time, never the gallery.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from orchestrator.gallery.shard_files import ShardEmbeddings, read_shard
from orchestrator.shard_update.files import ShardTarget, WrittenShard, write_shard_files

EmbedBlock = Callable[[pa.Table], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class ShardUpdate:
    """One planned shard update as a worker receives it (a few hundred bytes, never items).

    key:           its lineage step (``embed:<gallery>/<shard>:<gen>`` / ``split:…``);
    kind:          ``embed`` (the shard's items, all re-embedded) or ``split`` (the items a
                   selection names move to the new shard ``target``; ``source`` is the shard's file
                   (URI, sha256) they are removed from);
    num_items:     the items planned; rows: the planned gallery rows [start, stop) of a first
                   population (None: the items are those of a stored file);
    first_attempt: whether the step is on its first attempt (then no existing file is overwritten).
    """

    key: str
    kind: Literal["embed", "split"]
    shard: int
    num_items: int
    first_attempt: bool
    rows: tuple[int, int] | None = None
    target: int | None = None
    source: tuple[str, str] | None = None


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
                     space: str, curv: float, metadata_columns: tuple[str, ...], target: ShardTarget,
                     batch_size: int, node: str = "") -> ShardUpdateResult:
    """Embed the items of ``update`` streamed as ``blocks`` in batches of ``batch_size``, check they
    are exactly the planned ones, and write the shard files (module docstring)."""
    started, first_batch = time.time(), None
    spent = {"read_s": 0.0, "embed_s": 0.0, "write_s": 0.0}
    parts: list[dict[str, Any]] = []
    blocks = iter(blocks)
    while True:
        clock = time.perf_counter()
        block = next(blocks, None)
        spent["read_s"] += time.perf_counter() - clock
        if block is None:
            break
        for start in range(0, len(block), batch_size):
            piece = block.slice(start, batch_size)
            clock = time.perf_counter()
            embedding, uncertainty = embed(piece)
            spent["embed_s"] += time.perf_counter() - clock
            first_batch = first_batch or time.time()
            parts.append({"id": piece.column("id").to_numpy(), "row": piece.column("row").to_numpy(),
                          "label": piece.column("label").to_numpy(), "embedding": embedding,
                          "uncertainty": uncertainty, "attributes": piece.select(["uri", *metadata_columns])})
    clock = time.perf_counter()
    shard = assemble_shard(update, parts, generation, space, curv)
    if update.kind == "embed":
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
    spent["write_s"] = time.perf_counter() - clock
    return ShardUpdateResult(update.key, written, {"started": started, "first_batch": first_batch,
                                                   "finished": time.time(), "node": node, **spent})


def assemble_shard(update: ShardUpdate, parts: list[dict[str, Any]], generation: str, space: str,
                   curv: float) -> ShardEmbeddings:
    """The embedded rows of ``update`` (in arrival order) → its ``ShardEmbeddings``, sorted by id;
    RuntimeError unless they are exactly the planned items: ``num_items`` distinct ids, and the
    planned row range when there is one."""
    def column(name: str, dtype) -> np.ndarray:
        return np.concatenate([np.asarray(p[name], dtype=dtype) for p in parts]) if parts else np.zeros(0, dtype)

    ids, rows = column("id", np.int64), column("row", np.int64)
    planned = update.rows is None or np.array_equal(np.sort(rows), np.arange(*update.rows))
    if ids.size != update.num_items or np.unique(ids).size != ids.size or not planned:
        raise RuntimeError(f"{update.key}: the embedded items are not exactly the planned ones ({ids.size} rows, "
                           f"{np.unique(ids).size} distinct ids, {update.num_items} planned)")
    width = parts[0]["embedding"].shape[1] if parts else 0
    embeddings = np.concatenate([p["embedding"] for p in parts]) if parts else np.zeros((0, width), np.float32)
    attributes = (pa.concat_tables([p["attributes"] for p in parts], promote_options="default").combine_chunks()
                  if parts else None)
    return ShardEmbeddings(ids, column("label", np.int64), embeddings.astype(np.float32, copy=False),
                           column("uncertainty", np.float32), generation, space, curv, rows,
                           attributes).sorted_by_id()
