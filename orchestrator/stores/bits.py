"""Bit-plane codes in a store: the ``gallery.index`` binary kinds, searched by the store's Hamming distance.

A shard's codes are those its shard index of that kind holds (``index.binary_index``): a
``BitPlaneQuantizer`` fitted on the shard's coordinates (the Poincaré ball for both hyperbolic
spaces), ``bits`` per dimension (``n``), plane-major, each plane packed to ``B`` bytes, in the
kind's layout; ``s`` is the quantiser's step:

* ``binary``: plain codes (``n·B`` bytes); distance ``s² · d_H``, the Hamming distance;
* ``binary_weighted``: plane ``i`` repeated ``4^(n-i)`` times, so the Hamming distance is
  ``d_H^Σ = Σ_i 4^(n-i) d_H(x_i, y_i)``; distance ``s² · d_H^Σ``;
* ``binary_two_stage``: plain codes; ``rerank_factor · k`` candidates by ``d_H``, then ranked by
  ``s² · d_H^Σ`` computed from their codes (``rerank: weighted``) or by the space's exact distance
  from their stored coordinates (``rerank: float``, ``stores.vectors.rerank``).

So a store's search returns the shard index's distances. The kinds: ``index.kinds.HAMMING_KINDS``. The codes' bytes are the bits in order,
most significant first (``np.packbits``), as PostgreSQL's ``bit`` type holds them; the quantiser's
parameters and the layout go into the shard's lineage record (``shard_codes``), so a query is
encoded as its gallery shard was.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def shard_codes(embeddings: np.ndarray, space: str, curv: float, kind: str,
                options: Mapping[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
    """One shard's ``(N, D)`` embeddings → (its ``(N, C)`` uint8 codes, their record: ``kind``, the
    fitted ``quantizer``, the ``layout`` (``plain``/``weighted``), ``rerank``, ``rerank_factor``), as
    ``build_binary_index(embeddings, space, kind, **options)`` makes them."""
    from orchestrator.index.binary_index import build_binary_index

    index = build_binary_index(embeddings, space, kind, curv=curv, **dict(options))
    codes = index.encode(index.geometry.coordinates(np.asarray(embeddings, dtype=np.float64)))
    return codes, {"kind": kind, "quantizer": index.quantizer.to_dict(), "layout": index.codes,
                   "rerank": index.rerank, "rerank_factor": int(index.rerank_factor)}


def query_codes(queries: np.ndarray, space: str, curv: float, record: Mapping[str, Any]) -> np.ndarray:
    """``(Q, D)`` queries → ``(Q, C)`` uint8 codes, encoded as the shard's ``record`` says."""
    from orchestrator.geometry.geometry import Geometry
    from orchestrator.index.binary_index import encode_codes
    from orchestrator.index.bitplane import BitPlaneQuantizer

    coords = Geometry(space, curv).coordinates(np.asarray(queries, dtype=np.float64))
    return encode_codes(BitPlaneQuantizer.from_dict(record["quantizer"]), record["layout"], coords)


def candidates_per_query(record: Mapping[str, Any], k: int, ntotal: int) -> int:
    """Rows fetched by Hamming distance per query: ``k``, or ``rerank_factor · k`` (two-stage)."""
    return min(k * int(record["rerank_factor"]), ntotal) if record["rerank"] else k


def code_distances(query: np.ndarray, codes: np.ndarray, hamming: np.ndarray, record: Mapping[str, Any]) -> np.ndarray:
    """One query's ``(C,)`` code, its candidates' ``(F, C)`` codes and ``(F,)`` Hamming distances →
    ``(F,)`` float64 distances (module docstring; not for ``rerank: float``)."""
    from orchestrator.index.bitplane import BitPlaneQuantizer
    from orchestrator.index.hamming import weighted_hamming

    quantizer = BitPlaneQuantizer.from_dict(record["quantizer"])
    if record["rerank"] == "weighted":
        hamming = weighted_hamming(query[None, :], codes[None, :, :], quantizer.bits)[0]
    return quantizer.step ** 2 * np.asarray(hamming, dtype=np.float64)


def bit_strings(codes: np.ndarray) -> list[str]:
    """``(N, C)`` uint8 codes → N strings of ``8·C`` ``0``/``1`` (a bit literal)."""
    bits = np.unpackbits(np.asarray(codes, dtype=np.uint8), axis=1) + ord("0")
    return [row.tobytes().decode() for row in bits]


def codes_of_bit_strings(texts: list[str], code_bytes: int) -> np.ndarray:
    """Inverse of ``bit_strings``: ``(N, C)`` uint8."""
    if not texts:
        return np.zeros((0, code_bytes), np.uint8)
    bits = np.frombuffer("".join(texts).encode(), dtype=np.uint8).reshape(len(texts), 8 * code_bytes) - ord("0")
    return np.packbits(bits, axis=1)
