"""Which shard an item starts in: contiguous blocks of the sorted item ids.

Decision: the S initial shards take the sorted ids in S contiguous blocks whose sizes differ by at
most one (``numpy.array_split`` sizes), so a shard is a stable id range: the same gallery always
gives the same layout, whatever order the source lists its items in. Later, a partial item-level
backfill moves items into new shards (``orchestrator.pipeline.gallery.updater``); the lineage, not
this function, says where an item is after that.
"""
from __future__ import annotations

import numpy as np


def home_shards(ids: np.ndarray, num_shards: int) -> np.ndarray:
    """(N,) unique integer ids → (N,) the initial shard index of each item, in [0, num_shards)."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
        raise ValueError(f"ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if np.unique(ids).size != ids.size:
        raise ValueError("item ids must be unique")
    if ids.size < num_shards:
        raise ValueError(f"{ids.size} items cannot fill {num_shards} shards")
    order = np.argsort(ids, kind="stable")
    shard_of = np.empty(ids.size, dtype=np.int64)
    for shard, block in enumerate(np.array_split(order, num_shards)):
        shard_of[block] = shard
    return shard_of


def shard_members(ids: np.ndarray, num_shards: int) -> list[np.ndarray]:
    """The sorted item ids of each initial shard (``home_shards`` grouped): a list of S arrays."""
    ids = np.asarray(ids)
    shard_of = home_shards(ids, num_shards)
    return [np.sort(ids[shard_of == s]) for s in range(num_shards)]
