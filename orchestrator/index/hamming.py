"""Weighted bit-plane Hamming distance on packed plain codes (binary_hyperbolic.md eq. 10, §12.3).

``d_H^Σ(x, y) = Σ_{i=1..n} 4^(n-i) · popcount(x_i XOR y_i)`` where ``x_i`` is the ``i``-th packed
plane (MSB first) of a plane-major plain code (``bitplane`` module). Used by the two-stage index to
re-rank Hamming candidates without storing the 2.5×-larger weighted codes.
"""

from __future__ import annotations

import numpy as np

from orchestrator.index.bitplane import plane_weights


def weighted_hamming(queries: np.ndarray, candidates: np.ndarray, bits: int) -> np.ndarray:
    """``d_H^Σ`` between each query and its candidates: ``(Q, n·B), (Q, F, n·B) uint8 → (Q, F) int64``.

    ``bits`` is ``n``; ``B`` (bytes per plane) is ``code_bytes / n``.
    """
    q, f, code_bytes = candidates.shape
    if queries.shape != (q, code_bytes) or code_bytes % bits:
        raise ValueError(
            f"queries must be (Q, n·B) and candidates (Q, F, n·B) with n={bits}, got {queries.shape} and "
            f"{candidates.shape}"
        )
    differing = np.bitwise_count(np.bitwise_xor(candidates, queries[:, None, :]))  # (Q, F, n·B) uint8
    per_plane = differing.reshape(q, f, bits, code_bytes // bits).sum(axis=-1, dtype=np.int64)  # (Q, F, n)
    return per_plane @ plane_weights(bits)
