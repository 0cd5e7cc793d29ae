"""The ``least_compatible`` backfill order: re-embed first the stored generations that the new
generation searches worst.

A new generation searches each older generation's shards through compatibility, with the quality
the evaluation recorded as the cross-model metric M(φ_new^Q, φ_k^G) (hbct.md §11; the gate's and
the router's criterion value). Re-embedding an item of generation k replaces that cross-model
search by the new model's own; the gain is largest where M(φ_new^Q, φ_k^G) is lowest, so every
item of a less compatible generation comes before every item of a more compatible one. Within a
generation no item is known to gain more than another, so the seeded random order decides (items
budget: a uniform sample; shards budget: the generation's shards in random order).

This is our order, not a paper's: λ-orthogonality §2.11 and HBCT §14 order items by their old
embedding alone (class-mean distance, uncertainty), which cannot tell one old generation from
another. Torch-free, so that the Ray scoring tasks import it without torch.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from orchestrator.backfill.random_order import random_priority

__all__ = ["compatibility_ranks", "least_compatible_priority"]

_RANDOM_BITS = 32


def compatibility_ranks(cross: Mapping[str, float | None]) -> dict[str, int]:
    """Stored generation → rank (higher = re-embed earlier) from the new generation's recorded
    cross-model metric against it: the most compatible gets 0, each lower distinct value one more,
    and a generation it has no common distance with (None or NaN: it cannot search those shards
    at all) ranks above every other. Equal values share a rank."""
    searchable = sorted({float(v) for v in cross.values() if v is not None and not math.isnan(v)}, reverse=True)
    level = {value: rank for rank, value in enumerate(searchable)}
    return {name: len(searchable) if value is None or math.isnan(value) else level[float(value)]
            for name, value in cross.items()}


def least_compatible_priority(ids: np.ndarray, rank: int, seed: int) -> np.ndarray:
    """Priorities of one stored generation's items: (N,) integer ids → (N,) float64 in
    [rank, rank + 1), ``rank`` from ``compatibility_ranks`` plus the seeded random priority
    (``random_priority``) cut to 32 bits, so that the sum is exact in float64 and a higher rank
    always comes first."""
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < 2**20:
        raise ValueError(f"rank must be an int in [0, 2**20), got {rank!r}")
    random = np.floor(random_priority(ids, seed) * 2.0**_RANDOM_BITS) * 2.0**-_RANDOM_BITS
    return float(rank) + random
