"""FCT / FastFill's random backfilling baseline: a seeded pseudo-random priority per item, a hash
of (seed, item id), so it depends on nothing else (numpy only: scoring tasks on Ray workers import
it without torch)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


# splitmix64 (Steele et al. 2014) constants
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def random_priority(ids: np.ndarray | torch.Tensor, seed: int) -> np.ndarray:
    """Seeded random priority (FCT / FastFill random baseline, λ-orth §2.11): (N,) ids -> (N,) float64 in [0, 1).

    Each item's value is a hash (splitmix64) of (seed, item id), so it depends on nothing else:
    the same items get the same random order however they are split into shards or listed.
    """
    ids_np = np.asarray(ids.cpu().numpy() if hasattr(ids, "cpu") else ids)  # a torch tensor, or an array
    if ids_np.ndim != 1 or not np.issubdtype(ids_np.dtype, np.integer):
        raise ValueError(f"ids must be a 1-D integer array, got shape {ids_np.shape} dtype {ids_np.dtype}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an int, got {seed!r}")
    seed_mix = _splitmix64(np.array([int(seed) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    with np.errstate(over="ignore"):
        z = _splitmix64(ids_np.astype(np.int64).view(np.uint64) ^ seed_mix)
    return (z >> np.uint64(11)).astype(np.float64) * (2.0**-53)
