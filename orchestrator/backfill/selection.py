"""Exact gallery-wide backfill selection in bounded memory: the top ⌊β·N⌋ items of a priority
order, chosen shard by shard without bringing every score to one place.

The top k of a gallery are its first k items ranked by DESCENDING score, ties by ASCENDING item id
(one full sort). Here each shard keeps its own items as 128-bit keys (``priority_keys``: the first
word orders by descending score, the second by ascending id, so that ranking is the ascending key
order) and answers small questions about them; the driver
finds the k-th smallest key by radix selection — a histogram of the next 8 key bits among the
items that share the prefix found so far, from every shard, per round — and stops as soon as
few enough items share the prefix to fetch them (at most ``fetch_limit``). Every shard then
keeps the items whose key is at most that threshold. The result equals the full sort's choice
exactly (same keys, integer arithmetic, no float bins), for any ties.

Driver memory: one 256-bin histogram per shard per round and at most ``fetch_limit`` keys; the
shards (``ScoredShard``) live wherever the caller keeps them (the Ray layer: in the object store).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

_SIGN = np.uint64(1 << 63)
_DIGIT_BITS = 8
_LEVELS = 128 // _DIGIT_BITS


def priority_keys(scores: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N,) finite scores and (N,) int64 ids → two (N,) uint64 words whose ascending
    lexicographic order is the ranking (score descending, then id ascending)."""
    bits = (np.asarray(scores, dtype=np.float64) + 0.0).view(np.uint64)  # + 0.0: −0.0 → +0.0
    ascending = np.where(bits & _SIGN, ~bits, bits | _SIGN)  # IEEE order as unsigned order
    return ~ascending, np.asarray(ids, dtype=np.int64).view(np.uint64) ^ _SIGN


def _digit(words: tuple[np.ndarray, np.ndarray], level: int) -> np.ndarray:
    """Bits [8·level, 8·level + 8) of the 128-bit keys, counted from the top."""
    word = words[level * _DIGIT_BITS // 64]
    shift = np.uint64(64 - _DIGIT_BITS - (level * _DIGIT_BITS) % 64)
    return ((word >> shift) & np.uint64(0xFF)).astype(np.int64)


@dataclass(frozen=True)
class ScoredShard:
    """One shard's items as the selection sees them: ids (n,) int64 and their keys (two (n,) uint64)."""

    index: int
    ids: np.ndarray
    high: np.ndarray
    low: np.ndarray

    @classmethod
    def from_scores(cls, index: int, ids: np.ndarray, scores: np.ndarray) -> ScoredShard:
        high, low = priority_keys(scores, ids)
        return cls(index, np.asarray(ids, dtype=np.int64), high, low)

    def _matching(self, prefix: tuple[int, ...]) -> np.ndarray:
        mask = np.ones(self.ids.size, dtype=bool)
        for level, value in enumerate(prefix):
            mask &= _digit((self.high, self.low), level) == value
        return mask

    def histogram(self, prefix: tuple[int, ...]) -> np.ndarray:
        """(256,) counts of the next digit among the items whose key starts with ``prefix``."""
        mask = self._matching(prefix)
        return np.bincount(_digit((self.high[mask], self.low[mask]), len(prefix)), minlength=256)

    def keys_with(self, prefix: tuple[int, ...]) -> np.ndarray:
        """(m, 2) uint64 keys of the items whose key starts with ``prefix``."""
        mask = self._matching(prefix)
        return np.stack([self.high[mask], self.low[mask]], axis=1)

    def chosen(self, threshold: tuple[int, int]) -> np.ndarray:
        """Ids (sorted) of the items whose key is at most ``threshold``."""
        high, low = np.uint64(threshold[0]), np.uint64(threshold[1])
        return np.sort(self.ids[(self.high < high) | ((self.high == high) & (self.low <= low))])

    def best_key(self, threshold: tuple[int, int]) -> tuple[int, int] | None:
        """The smallest key of the shard if it is at most ``threshold`` (the shard's first pick)."""
        if not self.ids.size:
            return None
        first = np.lexsort((self.low, self.high))[0]
        key = (int(self.high[first]), int(self.low[first]))
        return key if key <= tuple(threshold) else None


Ask = Callable[[str, tuple], list[Any]]
"""``ask(method, args)``: call ``ScoredShard.<method>(*args)`` on every shard, results in shard order."""


def kth_key(ask: Ask, k: int, total: int, fetch_limit: int = 65536) -> tuple[int, int]:
    """The k-th smallest key (1-based) over all shards, by radix selection (module docstring)."""
    if not 1 <= k <= total:
        raise ValueError(f"k must lie in [1, {total}], got {k}")
    prefix: tuple[int, ...] = ()
    rank = k  # rank of the wanted key among the items sharing ``prefix``
    candidates = total
    while candidates > fetch_limit and len(prefix) < _LEVELS:
        counts = np.sum(ask("histogram", (prefix,)), axis=0)
        cumulative = np.cumsum(counts)
        digit = int(np.searchsorted(cumulative, rank))  # first digit whose cumulative count reaches rank
        rank -= int(cumulative[digit - 1]) if digit else 0
        candidates = int(counts[digit])
        prefix = (*prefix, digit)
    keys = np.concatenate([part for part in ask("keys_with", (prefix,))])
    order = np.lexsort((keys[:, 1], keys[:, 0]))
    high, low = keys[order[rank - 1]]
    return int(high), int(low)


def select_top(ask: Ask, k: int, total: int, fetch_limit: int = 65536) -> tuple[tuple[int, int] | None, list]:
    """(threshold key, per-shard ``best_key``) of the top-k selection; (None, []) when k is 0."""
    if k == 0:
        return None, []
    threshold = kth_key(ask, k, total, fetch_limit)
    return threshold, ask("best_key", (threshold,))


def in_memory_ask(shards: Sequence[ScoredShard]) -> Ask:
    """``ask`` over shards held in this process (tests and small galleries)."""
    return lambda method, args: [getattr(shard, method)(*args) for shard in shards]
