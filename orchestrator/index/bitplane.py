"""Bit-plane quantiser of binary hyperbolic embeddings (binary_hyperbolic.md §4, eqs. 4–9; §12.2).

Every coordinate of a ``(N, d)`` float array is quantised with ONE scalar range ``[lo, hi]`` and
``n`` bits (default 2):

* step (eq. 6): ``s = (hi - lo) / (2^n - 1)``;
* integer code (eqs. 4, 7): ``x_int = clip(round((x - lo) / s), 0, 2^n - 1)``; ``round`` is
  round-half-up, ``floor(v + 0.5)`` (the paper's ``⌊·⌉``); values outside ``[lo, hi]`` (queries,
  clipped outliers) go to the end levels;
* bit-planes (eq. 7), MSB first: ``plane_i = (x_int >> (n - i)) & 1`` for ``i = 1..n``, so
  ``x_int = Σ_i 2^(n-i) plane_i``.

Decision A1 (what ``r`` is, global or per dimension): the range is fitted from the data, not
taken from the ball radius (with ``c = 0.1`` the radius 3.16 is far wider than the coordinates
of real embeddings): ``lo, hi`` = the global min / max over ALL coordinates of the fitted
(gallery) array, the ``sup/inf`` form of eq. 6. With ``clip_percentile = p`` they are the
``p``-th and ``(100 - p)``-th percentiles of all coordinates instead, so that a few outliers do
not spend the levels. One scalar range for every dimension, as the ``r·1`` shift of eq. 4 implies
(per-dimension ranges would break eq. 8's proportionality). ``lo`` plays the role of ``-r``.

Decision A6 (layout): plane-major, ``[plane_1 | plane_2 | ... | plane_n]``; each plane is packed
with ``np.packbits`` (dimension ``j`` → byte ``j // 8``, bit ``7 - j % 8``) and zero-padded to
``B = ceil(d / 8)`` whole bytes, so each plane is byte-aligned (needed for per-plane popcount)
and padding bits are 0 in every code (they never add to a Hamming distance).

Codes:

* ``plain_codes`` ``(N, n·B)`` uint8: the ``d·n`` bits of the paper (§7);
* ``weighted_codes`` ``(N, B·(4^n - 1)/3)`` uint8: plane ``i`` repeated ``4^(n-i)`` times, so the
  plain Hamming distance between two such codes is exactly ``d_H^Σ = Σ_i 4^(n-i) d_H(x_i, y_i)``
  (eq. 10); for ``n = 2`` that is ``5d`` bits, 2.5× the plain code;
* ``plane_vectors`` ``(N, n·d)`` float32: ``s · 2^(n-i) · plane_i`` (plane-major), the binary code
  as a float vector for PQ/OPQ (§8): the squared L2 distance between two of them is exactly
  ``s² · d_H^Σ``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Bits per dimension: the integer codes are uint8.
MAX_BITS = 8
DEFAULT_BITS = 2


def check_bits(bits: Any) -> int:
    """``bits`` as an int in ``1..MAX_BITS``; ValueError naming the option otherwise."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an int in 1..{MAX_BITS} (bits per dimension), got {bits!r}")
    return int(bits)


def check_clip_percentile(clip_percentile: Any) -> float | None:
    """``None`` (global min/max) or a float in ``[0, 50)``; ValueError naming the option otherwise."""
    if clip_percentile is None:
        return None
    if isinstance(clip_percentile, bool) or not isinstance(clip_percentile, (int, float, np.integer, np.floating)):
        raise ValueError(f"clip_percentile must be None or a number in [0, 50), got {clip_percentile!r}")
    if not 0.0 <= float(clip_percentile) < 50.0:
        raise ValueError(f"clip_percentile must be None or a number in [0, 50), got {clip_percentile!r}")
    return float(clip_percentile)


def plane_weights(bits: int) -> np.ndarray:
    """``(n,)`` int64 weights ``4^(n-i)``, ``i = 1..n`` (eq. 10): MSB plane first."""
    return 4 ** np.arange(bits - 1, -1, -1, dtype=np.int64)


@dataclass(frozen=True)
class BitPlaneQuantizer:
    """``bits`` per dimension over the scalar range ``[lo, hi]`` (module docstring).

    ``dim`` is the number of coordinates ``d`` of the vectors it encodes.
    """

    bits: int
    lo: float
    hi: float
    dim: int

    def __post_init__(self) -> None:
        check_bits(self.bits)
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.hi > self.lo):
            raise ValueError(
                f"the bit-plane range must be finite with hi > lo, got lo={self.lo!r}, hi={self.hi!r} "
                "(all fitted coordinates equal?)"
            )
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1:
            raise ValueError(f"dim must be an int >= 1, got {self.dim!r}")

    @classmethod
    def fit(cls, coordinates: np.ndarray, bits: int = DEFAULT_BITS, clip_percentile: float | None = None) -> BitPlaneQuantizer:
        """Fit ``[lo, hi]`` on ``coordinates (N, d)`` (N >= 1): global min/max, or the
        ``clip_percentile``-th / ``(100 - clip_percentile)``-th percentiles of all coordinates."""
        bits = check_bits(bits)
        clip_percentile = check_clip_percentile(clip_percentile)
        coordinates = np.asarray(coordinates, dtype=np.float64)
        if coordinates.ndim != 2 or coordinates.shape[0] < 1 or coordinates.shape[1] < 1:
            raise ValueError(
                f"the bit-plane range is fitted on at least one (N, d) embedding, got shape {coordinates.shape}"
            )
        if clip_percentile is None or clip_percentile == 0.0:
            lo, hi = float(coordinates.min()), float(coordinates.max())
        else:
            lo, hi = (float(v) for v in np.percentile(coordinates, [clip_percentile, 100.0 - clip_percentile]))
        return cls(bits=bits, lo=lo, hi=hi, dim=int(coordinates.shape[1]))

    # -- derived sizes ---------------------------------------------------------------------------
    @property
    def levels(self) -> int:
        """``2^n`` integer levels."""
        return 1 << self.bits

    @property
    def step(self) -> float:
        """``s = (hi - lo) / (2^n - 1)`` (eq. 6)."""
        return (self.hi - self.lo) / (self.levels - 1)

    @property
    def plane_bytes(self) -> int:
        """``B = ceil(d / 8)`` bytes per packed plane."""
        return (self.dim + 7) // 8

    @property
    def plain_code_bytes(self) -> int:
        """``n·B`` bytes per plain code (= ``d·n / 8`` when ``8 | d``)."""
        return self.bits * self.plane_bytes

    @property
    def weighted_repeats(self) -> int:
        """Planes in a weighted code: ``Σ_i 4^(n-i) = (4^n - 1) / 3``."""
        return int(plane_weights(self.bits).sum())

    @property
    def weighted_code_bytes(self) -> int:
        """``B·(4^n - 1)/3`` bytes per weighted code (= ``d·(4^n - 1)/24`` when ``8 | d``)."""
        return self.weighted_repeats * self.plane_bytes

    # -- encoding --------------------------------------------------------------------------------
    def _check(self, coordinates: np.ndarray) -> np.ndarray:
        coordinates = np.asarray(coordinates, dtype=np.float64)
        if coordinates.ndim != 2 or coordinates.shape[1] != self.dim:
            raise ValueError(f"coordinates must be (N, {self.dim}), got shape {coordinates.shape}")
        return coordinates

    def integers(self, coordinates: np.ndarray) -> np.ndarray:
        """``(N, d)`` float → ``(N, d)`` uint8 integer codes ``x_int`` in ``0..2^n - 1`` (eq. 7)."""
        scaled = (self._check(coordinates) - self.lo) / self.step
        return np.clip(np.floor(scaled + 0.5), 0, self.levels - 1).astype(np.uint8)

    def planes(self, coordinates: np.ndarray) -> np.ndarray:
        """``(N, d)`` float → ``(N, n, d)`` uint8 bits; ``[:, 0]`` is the MSB plane ``x_1^b``."""
        ints = self.integers(coordinates)
        shifts = np.arange(self.bits - 1, -1, -1, dtype=np.uint8)
        return (ints[:, None, :] >> shifts[None, :, None]) & np.uint8(1)

    def plain_codes(self, coordinates: np.ndarray) -> np.ndarray:
        """``(N, d)`` float → ``(N, n·B)`` uint8 packed plane-major code (``d·n`` bits)."""
        packed = np.packbits(self.planes(coordinates), axis=-1)  # (N, n, B), zero-padded planes
        return np.ascontiguousarray(packed.reshape(len(packed), -1))

    def weighted_codes(self, coordinates: np.ndarray) -> np.ndarray:
        """``(N, d)`` float → ``(N, B·(4^n-1)/3)`` uint8: plane ``i`` repeated ``4^(n-i)`` times."""
        packed = np.packbits(self.planes(coordinates), axis=-1)  # (N, n, B)
        repeated = np.repeat(packed, plane_weights(self.bits), axis=1)
        return np.ascontiguousarray(repeated.reshape(len(packed), -1))

    def plane_vectors(self, coordinates: np.ndarray) -> np.ndarray:
        """``(N, d)`` float → ``(N, n·d)`` float32 ``s·2^(n-i)·plane_i`` (squared L2 = ``s²·d_H^Σ``)."""
        planes = self.planes(coordinates).astype(np.float64)
        scale = self.step * 2.0 ** np.arange(self.bits - 1, -1, -1)
        return np.ascontiguousarray((planes * scale[None, :, None]).reshape(len(planes), -1), dtype=np.float32)

    # -- serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe parameters (floats round-trip exactly through ``json``)."""
        return {"bits": self.bits, "lo": self.lo, "hi": self.hi, "dim": self.dim}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BitPlaneQuantizer:
        try:
            return cls(bits=data["bits"], lo=float(data["lo"]), hi=float(data["hi"]), dim=data["dim"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"invalid bit-plane quantiser parameters {data!r}: {exc!r}") from None
