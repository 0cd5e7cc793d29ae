"""Reproducible per-generation seeds."""
from __future__ import annotations

import json
import zlib
from typing import Any


def derive_seed(base_seed: int, *keys: Any) -> int:
    """A seed in [0, 2³¹) from ``base_seed`` and JSON-serialisable ``keys``: reproducible, and
    different for different keys, so that two generations never start from the same weights
    (two models that started alike share more than their training makes them share)."""
    key = json.dumps(keys, sort_keys=True, default=str)
    return (base_seed * 1_000_003 + zlib.crc32(key.encode())) % 2**31
