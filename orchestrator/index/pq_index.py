"""Product quantisation of hyperbolic and binary hyperbolic embeddings (binary_hyperbolic.md §8, Table 5).

Kinds (``faiss.index_factory`` strings; ``M = pq_m`` sub-quantisers of ``pq_nbits`` bits each):

* ``pq``  — "D + PQ": ``PQ{M}x{nbits}`` on the float coordinates (Poincaré-ball coordinates for both
  hyperbolic spaces, lorentz input mapped there first; raw euclidean; normalised cosine);
* ``opq`` — "D + OPQ": ``OPQ{M},PQ{M}x{nbits}`` (a learnt rotation, Ge et al. 2014) on the same;
* ``binary_opq`` — "Ours + OPQ": ``OPQ{M},PQ{M}x{nbits}`` on the bit-plane codes of a
  ``BitPlaneQuantizer`` fitted on the shard, fed as float vectors.

Decision (how binary codes become PQ input, A15): the ``(N, n·d)`` float32 vectors
``[s·2^(n-1)·plane_1 | ... | s·plane_n]`` (``BitPlaneQuantizer.plane_vectors``): {0,1} planes weighted
by ``2^(n-i)`` and the step ``s``, so that the squared L2 distance PQ approximates is exactly
``s²·d_H^Σ`` (eq. 10), in the same units as ``BinaryIndex``'s weighted kinds. Plane-major order
keeps each plane in whole sub-vectors when ``M`` divides ``n``: eq. 8's "grouping" the paper credits.

Decision (bit budget): the default ``M`` gives the same bits per item as the 2-bit plain binary code
(``pq``/``opq``: ``2d`` bits; ``binary_opq``: the ``n·d`` bits of its own code) with 8-bit
sub-codes, i.e. the largest divisor of the vector dimension that is ``<= 2d / 8`` (resp.
``n·d / 8``); Table 5 compares methods at equal bits. ``pq_m`` must divide the vector dimension.

Training: the codebooks (and OPQ's rotation) are trained on ``train_size`` items of the shard drawn
without replacement (``seed``); default ``39 · 2^nbits`` (9,984 for 8 bits: FAISS's own minimum
for k-means with ``2^nbits`` centroids). On one core here, 9,984 128-d points train PQ32x8 in
about 9 s and OPQ32 + PQ32x8 (FAISS's 50 OPQ iterations) in about 2 min. The shard needs at least
``2^nbits`` items; FAISS's warning for fewer than 39 training points per centroid is silenced.

Distances returned: PQ's asymmetric approximation of the squared L2 distance between the query's
vector and the item's reconstruction — squared Euclidean between coordinates (``pq``, ``opq``) or
``≈ s²·d_H^Σ`` (``binary_opq``), comparable across shards of the same kind.
Memory per item: ``M·nbits / 8`` bytes of code (+ 8 for non-default item ids); plus the codebooks
(``2^nbits · D_vec`` floats) and OPQ's ``D_vec × D_vec`` rotation, once per shard.
"""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np

from orchestrator.geometry.geometry import Geometry
from orchestrator.geometry.spaces import Space
from orchestrator.index.bitplane import DEFAULT_BITS, BitPlaneQuantizer
from orchestrator.index.compressed import CompressedIndex, position_ids
from orchestrator.index.kinds import PQ_KINDS
from orchestrator.index.shard_index import _as_matrix, _check_curv, _check_positive_int

DEFAULT_PQ_NBITS = 8
#: Bits of a sub-code are limited by FAISS's PQ (and 2^16 centroids would be very slow to train).
MAX_PQ_NBITS = 16


class PQIndex(CompressedIndex):
    """A FAISS (O)PQ index over one shard (module docstring).

    ``index``: the ``index_factory`` index (labels = positions); ``quantizer``: the shard's
    ``BitPlaneQuantizer`` (``binary_opq`` only, else None); ``pq_m``, ``pq_nbits``: its layout.
    """

    KINDS = PQ_KINDS

    def __init__(self, *, index: Any, pq_m: int, pq_nbits: int, quantizer: BitPlaneQuantizer | None = None,
                 **common: Any) -> None:
        super().__init__(**common)
        self.index = index
        self.pq_m = pq_m
        self.pq_nbits = pq_nbits
        self.quantizer = quantizer

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def code_bytes(self) -> int:
        return int(self.index.sa_code_size())

    @property
    def memory_bytes(self) -> int:
        """Codes + item ids + codebooks + OPQ rotation (float32)."""
        vector_dim = int(self.index.d)
        trained = (1 << self.pq_nbits) * vector_dim * 4
        if self.kind != "pq":
            trained += vector_dim * vector_dim * 4
        return self.ntotal * self.code_bytes + self._ids_bytes() + trained

    def vectors(self, coords: np.ndarray) -> np.ndarray:
        """``(N, d)`` coordinates → the ``(N, D_vec)`` float32 vectors PQ encodes (module docstring)."""
        if self.quantizer is not None:
            return self.quantizer.plane_vectors(coords)
        return np.ascontiguousarray(coords, dtype=np.float32)

    def search(self, queries: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest items of each query: ``(Q, D) -> distances (Q, k) float64, ids (Q, k) int64``.

        Distances are PQ's approximate squared L2 (module docstring), sorted ascending; missing
        slots (``k > ntotal``) hold id ``-1`` and distance ``+inf``.
        """
        coords, k = self._query_coordinates(queries, k)
        if len(coords) == 0 or self.ntotal == 0:
            return self._missing(len(coords), k)
        distances, labels = self.index.search(self.vectors(coords), k)
        return self._top_k(distances.astype(np.float64), labels, k)

    def _params(self) -> dict[str, Any]:
        return {"pq_m": self.pq_m, "pq_nbits": self.pq_nbits,
                "quantizer": None if self.quantizer is None else self.quantizer.to_dict()}

    def _sections(self) -> dict[str, bytes]:
        return {"faiss": faiss.serialize_index(self.index).tobytes()}

    @classmethod
    def _from_parts(cls, common: dict[str, Any], header: dict[str, Any], sections: dict[str, bytes]) -> PQIndex:
        index = faiss.deserialize_index(np.frombuffer(sections["faiss"], dtype=np.uint8).copy())
        quantizer = None if header["quantizer"] is None else BitPlaneQuantizer.from_dict(header["quantizer"])
        return cls(index=index, pq_m=header["pq_m"], pq_nbits=header["pq_nbits"], quantizer=quantizer, **common)


def _training_settings(index: Any) -> None:
    """No polysemous training (``index_factory`` turns it on for ``IndexPQ``: it re-orders the codes
    for Hamming-filtered search, which is not used, and was 85% of the training time); FAISS's
    per-k-means warning for fewer than 39 training points per centroid (printed once per OPQ
    iteration) silenced: small shards are allowed, ``N >= 2^nbits`` is checked instead. OPQ's inner
    PQ is pointed at the index's PQ so that it uses the same clustering parameters."""
    pq_index = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexPreTransform) else index
    pq_index.do_polysemous_training = False
    pq_index.pq.cp.min_points_per_centroid = 1
    if pq_index is not index:
        faiss.downcast_VectorTransform(index.chain.at(0)).pq = pq_index.pq


def default_pq_m(vector_dim: int, budget_bits: int, pq_nbits: int = DEFAULT_PQ_NBITS) -> int:
    """Largest ``M`` dividing ``vector_dim`` with ``M · pq_nbits <= budget_bits`` (at least 1)."""
    limit = max(1, budget_bits // pq_nbits)
    return max(m for m in range(1, min(limit, vector_dim) + 1) if vector_dim % m == 0)


def build_pq_index(
    embeddings: Any,
    space: Space | str,
    kind: str = "pq",
    ids: Any = None,
    *,
    curv: float = 1.0,
    pq_m: int | None = None,
    pq_nbits: int = DEFAULT_PQ_NBITS,
    train_size: int | None = None,
    seed: int = 0,
    bits: int | None = None,
    clip_percentile: float | None = None,
) -> PQIndex:
    """Build a ``PQIndex`` of ``kind`` over ``embeddings (N, D)`` of ``space`` (module docstring).

    ``pq_m``: sub-quantisers (default: the 2-bit binary code's bit budget, module docstring; must
    divide the vector dimension, ``d`` or ``n·d``); ``pq_nbits``: bits per sub-code (1..16, default 8);
    ``train_size``: items the codebooks are trained on (default ``39·2^pq_nbits``, at most ``N``);
    ``seed``: of that sample. ``binary_opq`` only: ``bits`` (default 2) and ``clip_percentile`` of its
    ``BitPlaneQuantizer``. ``ids``, ``curv``: as ``build_index``. Needs ``N >= 2^pq_nbits``.
    """
    space = Space.parse(space)
    if kind not in PQ_KINDS:
        raise ValueError(f"kind must be one of {list(PQ_KINDS)}, got {kind!r}")
    if kind != "binary_opq" and (bits is not None or clip_percentile is not None):
        name, value = ("bits", bits) if bits is not None else ("clip_percentile", clip_percentile)
        raise ValueError(f"{name} applies to kind='binary_opq' only, got kind={kind!r} with {name}={value!r}")
    curv = _check_curv(curv)
    if isinstance(pq_nbits, bool) or not isinstance(pq_nbits, (int, np.integer)) or not 1 <= pq_nbits <= MAX_PQ_NBITS:
        raise ValueError(f"pq_nbits must be an int in 1..{MAX_PQ_NBITS}, got {pq_nbits!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    embeddings = _as_matrix(embeddings, "embeddings")
    geometry = Geometry(space, curv)
    geometry.check_points(embeddings)
    n, dim = embeddings.shape
    centroids = 1 << int(pq_nbits)
    if n < centroids:
        raise ValueError(f"kind={kind!r} needs at least 2^pq_nbits = {centroids} embeddings to train, got {n}")
    train_size = min(n, 39 * centroids if train_size is None else _check_positive_int(train_size, "train_size"))
    if train_size < centroids:
        raise ValueError(f"train_size must be >= 2^pq_nbits = {centroids}, got {train_size}")

    coords = geometry.coordinates(embeddings)
    quantizer = None
    budget = 2 * coords.shape[1]
    if kind == "binary_opq":
        quantizer = BitPlaneQuantizer.fit(coords, DEFAULT_BITS if bits is None else bits, clip_percentile)
        budget = quantizer.bits * quantizer.dim
    vectors = quantizer.plane_vectors(coords) if quantizer is not None else np.ascontiguousarray(coords, dtype=np.float32)
    vector_dim = vectors.shape[1]
    pq_m = default_pq_m(vector_dim, budget, int(pq_nbits)) if pq_m is None else _check_positive_int(pq_m, "pq_m")
    if vector_dim % pq_m:
        raise ValueError(f"pq_m must divide the vector dimension {vector_dim} of kind={kind!r}, got pq_m={pq_m}")
    pq = f"PQ{pq_m}x{int(pq_nbits)}"
    index = faiss.index_factory(vector_dim, pq if kind == "pq" else f"OPQ{pq_m},{pq}")
    _training_settings(index)
    sample = np.random.default_rng(int(seed)).choice(n, size=train_size, replace=False)
    index.train(vectors[np.sort(sample)])
    index.add(vectors)
    return PQIndex(index=index, pq_m=pq_m, pq_nbits=int(pq_nbits), quantizer=quantizer, kind=kind, space=space,
                   curv=curv, dim=dim, ids=position_ids(ids, n))
