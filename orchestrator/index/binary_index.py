"""Binary hyperbolic embeddings in FAISS binary indexes (binary_hyperbolic.md §5, §7, §12.3–12.4).

The gallery's coordinates (``Geometry.coordinates``: Lorentz mapped to the Poincaré ball) are quantised by a
``BitPlaneQuantizer`` fitted on THIS shard (``bits`` per dimension, default 2; global min/max or a
percentile clip, decision A1 in ``bitplane``); queries are encoded with the same quantiser.

Kinds (decision A4: the paper names no FAISS index, so each option of spec §7 is a kind); bytes
per item are those of the codes FAISS stores, ``B = ceil(d/8)`` bytes per plane:

* ``binary`` — ``IndexBinaryFlat(n·8B)``: unweighted Hamming over the concatenated planes (§7 (A),
  the paper's FAISS memory). ``n·B`` bytes (= ``d·n/8``; 2 bits, 128-d: 32 bytes, 16× less than
  float32).
* ``binary_weighted`` — ``IndexBinaryFlat``, plane ``i`` stored ``4^(n-i)`` times, so FAISS's
  Hamming distance IS the paper's ``d_H^Σ`` (eq. 10), exactly (§7 (B)). ``B·(4^n-1)/3`` bytes
  (= ``d·(4^n-1)/24``): for n = 2, ``5d`` bits, 2.5× ``binary``'s memory.
* ``binary_two_stage`` — ``binary``'s search fetches ``rerank_factor·k`` candidates (default 10·k),
  re-ranked (§7 (C)) by ``rerank="weighted"`` (default): the exact ``d_H^Σ`` from the stored plain
  codes (numpy popcount, ``hamming``), memory as ``binary``; or ``rerank="float"``: the space's
  exact distance on float32 coordinates stored beside the codes, ``n·B + 4d`` bytes (more than a
  float index: the codes only speed up the candidate search).
* ``binary_ivf`` — ``IndexBinaryIVF`` (``nlist`` cells, default ``default_nlist(N)``; ``nprobe``
  probed, default ``nlist // 4``) over ``codes="weighted"`` (default: its Hamming is ``d_H^Σ``) or
  ``codes="plain"``; approximate (only the probed cells are searched). Bytes as the flat kind of
  that layout, + 8 for the item id each inverted list stores.

Distances returned (``search``), chosen so that a router can merge top-k lists of shards with
DIFFERENT fitted ranges (the step ``s`` differs per shard, raw Hamming counts do not compare):

* ``binary_weighted``, ``binary_two_stage`` (``rerank="weighted"``), ``binary_ivf``
  (``codes="weighted"``): ``s² · d_H^Σ``. With the diagonal-plane approximation of eq. 9 (decision
  A3: the paper's distance, cross-plane terms dropped; spec §4.1 example 10 vs 14) this
  approximates the squared Euclidean distance between the (Poincaré) coordinates, ``||x - y||²``;
* ``binary``, ``binary_ivf`` (``codes="plain"``): ``s² · d_H`` (unweighted Hamming of the planes),
  the same units but a cruder proxy (an MSB difference counts as much as an LSB one; it equals
  the squared L2 of the dequantised codes only for ``n = 1``);
* ``binary_two_stage`` with ``rerank="float"``: the space's exact retrieval distance of the
  candidates (Poincaré geodesic for both hyperbolic spaces, L2, ``1 - cos``), as ``ShardIndex``.

Shards of different kinds return different units: merge results of one kind only.
"""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np

from orchestrator.geometry.geometry import Geometry
from orchestrator.geometry.spaces import Space
from orchestrator.index.bitplane import DEFAULT_BITS, BitPlaneQuantizer
from orchestrator.index.compressed import CompressedIndex, position_ids
from orchestrator.index.hamming import weighted_hamming
from orchestrator.index.kinds import BINARY_KINDS
from orchestrator.index.shard_index import _as_matrix, _check_curv, _check_ids, _check_positive_int, default_nlist

CODE_LAYOUTS = ("plain", "weighted")
RERANKS = ("weighted", "float")
#: Candidates per requested neighbour of the two-stage search (k = 50 → 500 candidates).
DEFAULT_RERANK_FACTOR = 10


class BinaryIndex(CompressedIndex):
    """A FAISS binary index over one shard's bit-plane codes (module docstring).

    ``index``: ``IndexBinaryFlat`` (labels = positions) or ``IndexBinaryIVF`` (labels = item ids);
    ``quantizer``: the shard's ``BitPlaneQuantizer``; ``codes``: the layout FAISS stores
    (``"plain"`` / ``"weighted"``); ``rerank``: ``None``, ``"weighted"`` or ``"float"`` (two-stage);
    ``vectors``: ``(N, d)`` float32 coordinates by position (``rerank="float"`` only).
    """

    KINDS = BINARY_KINDS

    def __init__(self, *, index: Any, quantizer: BitPlaneQuantizer, codes: str, rerank: str | None = None,
                 rerank_factor: int = DEFAULT_RERANK_FACTOR, vectors: np.ndarray | None = None,
                 nprobe: int | None = None, **common: Any) -> None:
        super().__init__(**common)
        self.index = index
        self.quantizer = quantizer
        self.codes = codes
        self.rerank = rerank
        self.rerank_factor = _check_positive_int(rerank_factor, "rerank_factor")
        self.vectors = vectors
        self.nprobe: int | None = None
        self.set_search_params(nprobe=nprobe)
        if isinstance(index, faiss.IndexBinaryFlat):
            # FAISS's counting-sort k-NN for plain codes, its heap for the 2.5× longer weighted ones:
            # measured at 10^5 items, 256-bit codes: 0.14-0.16 ms vs 0.15-0.25 ms per query (k = 50),
            # 0.19-0.24 vs 0.37-0.44 ms (two-stage, k = 500); 640-bit codes: 0.48-0.62 vs 0.37 ms.
            # Not serialised by FAISS, so set on every construction.
            index.use_heap = codes == "weighted"

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def code_bytes(self) -> int:
        return int(self.index.code_size)

    @property
    def memory_bytes(self) -> int:
        """Codes + item ids (+ float32 vectors for ``rerank="float"``; + IVF ids and centroids)."""
        total = self.ntotal * self.code_bytes + self._ids_bytes()
        if self.vectors is not None:
            total += self.vectors.nbytes
        if self.kind == "binary_ivf":
            total += self.ntotal * 8 + int(self.index.nlist) * self.code_bytes
        return total

    def set_search_params(self, nprobe: int | None = None, rerank_factor: int | None = None) -> None:
        """Change the IVF ``nprobe`` / two-stage ``rerank_factor`` of later searches (None: keep)."""
        if nprobe is not None:
            if self.kind != "binary_ivf":
                raise ValueError(f"nprobe applies to kind='binary_ivf' only, this index is {self.kind!r}")
            self.index.nprobe = min(_check_positive_int(nprobe, "nprobe"), int(self.index.nlist))
            self.nprobe = int(self.index.nprobe)
        if rerank_factor is not None:
            if self.kind != "binary_two_stage":
                raise ValueError(f"rerank_factor applies to kind='binary_two_stage' only, this index is {self.kind!r}")
            self.rerank_factor = _check_positive_int(rerank_factor, "rerank_factor")

    # -- search ----------------------------------------------------------------------------------
    def encode(self, coords: np.ndarray) -> np.ndarray:
        """``(N, d)`` coordinates → ``(N, code_bytes)`` uint8 codes in the layout this index stores."""
        return encode_codes(self.quantizer, self.codes, coords)

    def _stored_codes(self) -> np.ndarray:
        """``(N, code_bytes)`` uint8 view (no copy) of an ``IndexBinaryFlat``'s codes, by position;
        valid while ``self.index`` is alive and unchanged (it is never added to after the build)."""
        return faiss.rev_swig_ptr(self.index.xb.data(), self.ntotal * self.code_bytes).reshape(self.ntotal, -1)

    def search(self, queries: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest items of each query: ``(Q, D) -> distances (Q, k) float64, ids (Q, k) int64``.

        Sorted ascending (ties: FAISS's order); distances as in the module docstring; missing slots
        (``k > ntotal``, IVF cells with fewer items) hold id ``-1`` and distance ``+inf``.
        """
        coords, k = self._query_coordinates(queries, k)
        if len(coords) == 0 or self.ntotal == 0:
            return self._missing(len(coords), k)
        query_codes = self.encode(coords)
        scale = self.quantizer.step ** 2
        if self.rerank is None:
            hamming, labels = self.index.search(query_codes, k)
            return self._top_k(scale * hamming.astype(np.float64), labels, k)
        fetch = min(k * self.rerank_factor, self.ntotal)
        _, labels = self.index.search(query_codes, fetch)
        positions = np.maximum(labels, 0)  # flat index: every label < ntotal is found
        if self.rerank == "weighted":
            distances = scale * weighted_hamming(query_codes, self._stored_codes()[positions], self.quantizer.bits)
        else:
            distances = self.geometry.coordinate_distance(coords[:, None, :], self.vectors[positions])
        return self._top_k(distances.astype(np.float64), labels, k)

    # -- serialisation ---------------------------------------------------------------------------
    def _params(self) -> dict[str, Any]:
        return {"quantizer": self.quantizer.to_dict(), "codes": self.codes, "rerank": self.rerank,
                "rerank_factor": self.rerank_factor, "nprobe": self.nprobe}

    def _sections(self) -> dict[str, bytes]:
        sections = {"faiss": faiss.serialize_index_binary(self.index).tobytes()}
        if self.vectors is not None:
            sections["vectors"] = self.vectors.astype("<f4").tobytes()
        return sections

    @classmethod
    def _from_parts(cls, common: dict[str, Any], header: dict[str, Any], sections: dict[str, bytes]) -> BinaryIndex:
        index = faiss.deserialize_index_binary(np.frombuffer(sections["faiss"], dtype=np.uint8).copy())
        quantizer = BitPlaneQuantizer.from_dict(header["quantizer"])
        vectors = None
        if header["rerank"] == "float":
            vectors = np.frombuffer(sections["vectors"], dtype="<f4").astype(np.float32).reshape(index.ntotal, quantizer.dim)
        return cls(index=index, quantizer=quantizer, codes=header["codes"], rerank=header["rerank"],
                   rerank_factor=header["rerank_factor"], vectors=vectors, nprobe=header["nprobe"], **common)


# --- building -----------------------------------------------------------------------------------
def encode_codes(quantizer: BitPlaneQuantizer, codes: str, coords: np.ndarray) -> np.ndarray:
    """``(N, d)`` coordinates → ``(N, code_bytes)`` uint8 codes in layout ``codes`` (``plain``/``weighted``)."""
    return quantizer.weighted_codes(coords) if codes == "weighted" else quantizer.plain_codes(coords)


def _choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def _only_for(kind: str, owner: str, **options: Any) -> None:
    """ValueError when an option of kind ``owner`` is given to another kind."""
    for name, value in options.items():
        if value is not None and kind != owner:
            raise ValueError(f"{name} applies to kind={owner!r} only, got kind={kind!r} with {name}={value!r}")


def build_binary_index(
    embeddings: Any,
    space: Space | str,
    kind: str = "binary",
    ids: Any = None,
    *,
    curv: float = 1.0,
    bits: int = DEFAULT_BITS,
    clip_percentile: float | None = None,
    rerank: str | None = None,
    rerank_factor: int | None = None,
    nlist: int | None = None,
    nprobe: int | None = None,
    codes: str | None = None,
) -> BinaryIndex:
    """Build a ``BinaryIndex`` of ``kind`` over ``embeddings (N, D)`` of ``space`` (module docstring).

    ``bits``: bits per dimension ``n`` (1..8, default 2); ``clip_percentile``: None (global min/max)
    or ``p`` in [0, 50) (range = p-th / (100-p)-th percentile of all coordinates). ``binary_two_stage``:
    ``rerank`` ``"weighted"`` (default) / ``"float"``, ``rerank_factor`` (default 10). ``binary_ivf``:
    ``nlist`` (default ``default_nlist(N)``, needs ``N >= nlist``), ``nprobe`` (default ``nlist // 4``),
    ``codes`` ``"weighted"`` (default) / ``"plain"``. ``ids (N,)``: unique non-negative item ids
    (default ``0..N-1``). ``curv``: curvature of the hyperbolic spaces (lorentz input ``(N, d+1)``, time
    first, is mapped to the Poincaré ball). Needs ``N >= 1`` (the range is fitted on the shard).
    """
    space = Space.parse(space)
    _choice(kind, "kind", BINARY_KINDS)
    curv = _check_curv(curv)
    _only_for(kind, "binary_two_stage", rerank=rerank, rerank_factor=rerank_factor)
    _only_for(kind, "binary_ivf", nlist=nlist, nprobe=nprobe, codes=codes)
    embeddings = _as_matrix(embeddings, "embeddings")
    geometry = Geometry(space, curv)
    geometry.check_points(embeddings)
    n, dim = embeddings.shape
    if n < 1:
        raise ValueError(f"kind={kind!r} needs at least one embedding to fit the bit-plane range, got shape {embeddings.shape}")
    coords = geometry.coordinates(embeddings)
    quantizer = BitPlaneQuantizer.fit(coords, bits, clip_percentile)
    common = {"kind": kind, "space": space, "curv": curv, "dim": dim}

    if kind == "binary_ivf":
        codes = _choice("weighted" if codes is None else codes, "codes", CODE_LAYOUTS)
        nlist = default_nlist(n) if nlist is None else _check_positive_int(nlist, "nlist")
        if n < nlist:
            raise ValueError(f"kind='binary_ivf' needs at least nlist={nlist} embeddings to train, got {n}")
        gallery_codes = encode_codes(quantizer, codes, coords)
        nbits = 8 * gallery_codes.shape[1]
        index = faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(nbits), nbits, nlist)  # keeps its quantizer alive
        index.train(gallery_codes)
        index.add_with_ids(gallery_codes, _check_ids(ids, n))
        nprobe = max(1, nlist // 4) if nprobe is None else nprobe
        return BinaryIndex(index=index, quantizer=quantizer, codes=codes, nprobe=nprobe, ids=None, **common)

    codes = "weighted" if kind == "binary_weighted" else "plain"
    vectors = None
    if kind == "binary_two_stage":
        rerank = _choice("weighted" if rerank is None else rerank, "rerank", RERANKS)
        rerank_factor = DEFAULT_RERANK_FACTOR if rerank_factor is None else rerank_factor
        if rerank == "float":
            vectors = np.ascontiguousarray(coords, dtype=np.float32)
    else:
        rerank_factor = DEFAULT_RERANK_FACTOR
    gallery_codes = encode_codes(quantizer, codes, coords)
    index = faiss.IndexBinaryFlat(8 * gallery_codes.shape[1])
    index.add(gallery_codes)
    return BinaryIndex(index=index, quantizer=quantizer, codes=codes, rerank=rerank, rerank_factor=rerank_factor,
                       vectors=vectors, ids=position_ids(ids, n), **common)

