"""One FAISS index per gallery shard, searched with the generation's retrieval distance.

``build_index(embeddings, space, kind)`` builds the index; ``ShardIndex.search(queries, k)`` returns
``(distances, ids)`` where the distances are those of ``Geometry(space, curv).pairwise_distance``
(``orchestrator.geometry``; smaller is closer) and the ids are item ids (``ids`` given at build time, else row numbers).

Metric per space (what FAISS stores and how the query is transformed; the stored coordinates are
``Geometry.coordinates(x, hyperbolic_model="lorentz")``):

* ``euclidean``: L2 index on the raw vectors (FAISS ranks by squared L2, same order as L2);
* ``cosine``: inner-product index on L2-normalised gallery vectors, queries normalised the same way
  (zero vectors stay zero, as with ``F.normalize``, so their distance is 1 to everything);
* ``lorentz``: inputs are full points ``(N, d+1)``, time first. The gallery is stored as
  ``x = [x_t, x_s]`` and a query ``q`` is searched as ``[-q_t, q_s]``, so the FAISS inner product is
  ``q_s . x_s - q_t x_t = <q,x>_L``. On the hyperboloid ``d(q, x) = arccosh(-K <q,x>_L) / sqrt(K)``
  is monotone DECREASING in ``<q,x>_L`` (``-K<q,x>_L >= 1`` grows as ``<q,x>_L`` falls), so the
  nearest items are those with the LARGEST inner product: exactly what a max-inner-product index
  returns. Hyperbolic search therefore costs one dot product per item, like Euclidean search.
  Decision: ``x_t`` (gallery and queries) is recomputed from ``x_s`` with the hyperboloid constraint
  (float64), like the ``lorentz`` module's functions that only need the space part, so points that
  drifted off the hyperboloid by rounding still rank correctly;
* ``poincare``: points of the ball of radius ``1/sqrt(K)`` are mapped to the Lorentz model with the
  isometry ``lorentz.from_poincare`` (float64), then searched exactly as ``lorentz``. The distances
  are unchanged by the isometry, so this is an exact search of the Poincaré distance.

Decision (hyperbolic spaces with ``ivf``/``hnsw``): the inner-product trick is exact for ``flat`` only.
An HNSW graph and IVF k-means are built from GALLERY-GALLERY similarities, which on stored
``[x_t, x_s]`` vectors are Euclidean inner products ``x_t y_t + x_s . y_s``, not Lorentz ones; only the
query side carries the time flip. Measured here: HNSW recall@10 of 0.15 on 3k points of L^16. So the
approximate kinds use the MIPS-to-L2 reduction (Bachrach et al. 2014; ``index.mips``): the gallery is stored as
``[x_t, x_s, sqrt(M^2 - ||x||^2)]`` (``M`` = the largest Euclidean norm of the shard, so every stored
row has norm ``M``) and a query as ``[-q_t, q_s, 0]``; then ``||a - b||^2 = M^2 + ||b||^2 - 2<q,x>_L``,
so L2 order is exactly geodesic order, and gallery-gallery L2 is an ambient distance of points on a
sphere, which HNSW graphs and k-means handle. ``refine_factor * k`` candidates are fetched (the float32
L2 loses digits to the large ``M^2``) and ranked by their exact geodesic distance (float64, below).
Measured (3k points of L^16, curv 0.5, spread 1.5): HNSW recall@10 1.0 with this, 0.31 with an L2
index on Poincaré-ball coordinates; IVF stays weak on such spread-out data (0.46 at nprobe = nlist/4).

Index kinds: ``flat`` (exact; the default), ``ivf`` (``IndexIVFFlat``, ``nlist`` cells, ``nprobe``
probed at search, default ``nlist // 4``) and ``hnsw`` (``IndexHNSWFlat``, ``hnsw_m`` links, ``ef_search``), all with the
metric above, wrapped in ``IndexIDMap2`` so that search returns item ids and stored vectors can be
reconstructed by id.

Distances: FAISS ranks the candidates in float32; the returned distances are then recomputed in
float64 from the stored vectors of the ``k`` candidates (a refine step, ``O(Q k D)``) and the ``k``
candidates re-sorted by them (``Geometry.coordinate_distance``). This matters for the hyperbolic spaces,
where converting a float32 inner product back through ``arccosh`` loses most digits for nearby points;
the float64 chord form of ``lorentz.distance`` does not. Euclidean distances are L2 (not squared), cosine ``1 - cos``.

Missing results: when fewer than ``k`` items are found (``k > ntotal``, or an IVF/HNSW search that
visits fewer than ``k`` items), the missing slots keep FAISS's id ``-1`` and get distance ``+inf``;
they are always at the end of a row. Item ids must therefore be ``>= 0`` (and unique).

Serialisation is pickle-free: ``to_bytes`` writes a magic string and a small JSON header (space, curv,
kind, dim, search parameters, sha256 of the FAISS bytes; ``container.pack_header``), then
``faiss.serialize_index``'s bytes;
``save``/``load`` go through the storage layer (atomic writes, local paths or object stores).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import faiss
import numpy as np

from orchestrator.geometry.geometry import Geometry
from orchestrator.geometry.spaces import Space
from orchestrator.index.container import pack_header, unpack_header
from orchestrator.index.kinds import SHARD_KINDS as KINDS
from orchestrator.index.mips import mips_gallery, mips_queries, uses_mips
from orchestrator.storage.filesystem import read_bytes, redact_uri, write_bytes_atomic

IndexKind = Literal["flat", "ivf", "hnsw"]

#: First bytes of every serialised ShardIndex.
MAGIC = b"ORCHIDX1"
FORMAT_VERSION = 1
#: Default HNSW search breadth (``efSearch``); FAISS's own default of 16 gives poor recall@10.
DEFAULT_EF_SEARCH = 128
DEFAULT_EF_CONSTRUCTION = 80
#: Candidates fetched per requested neighbour by the hyperbolic IVF/HNSW proxy search.
DEFAULT_REFINE_FACTOR = 4


# --- validation helpers -----------------------------------------------------------------------
def _as_matrix(values: Any, name: str) -> np.ndarray:
    """``values`` as a C-contiguous float64 (N, D) array; ValueError naming ``name`` otherwise."""
    if hasattr(values, "detach"):  # torch tensor
        values = values.detach().cpu().numpy()
    try:
        array = np.asarray(values)
    except Exception as exc:  # noqa: BLE001 - re-raised as a clear ValueError
        raise ValueError(f"{name} must be a numeric (N, D) array: {exc}") from None
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (N, D) array, got shape {array.shape}")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{name} must be a numeric (N, D) array, got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.float64)
    if not np.isfinite(array).all():
        bad = int((~np.isfinite(array).all(axis=1)).sum())
        raise ValueError(f"{name} contains non-finite values (NaN or inf) in {bad} row(s)")
    return array


def _check_curv(curv: Any) -> float:
    if isinstance(curv, bool) or not isinstance(curv, (int, float, np.floating, np.integer)):
        raise ValueError(f"curv must be a positive float, got {curv!r}")
    curv = float(curv)
    if not 0.0 < curv < math.inf:
        raise ValueError(f"curv must be finite and > 0 (curvature is -curv), got {curv!r}")
    return curv


def _check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _check_ids(ids: Any, n: int) -> np.ndarray:
    if ids is None:
        return np.arange(n, dtype=np.int64)
    if hasattr(ids, "detach"):
        ids = ids.detach().cpu().numpy()
    array = np.asarray(ids)
    if array.shape != (n,):
        raise ValueError(f"ids must have shape ({n},) (one per embedding), got {array.shape}")
    if n and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"ids must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64)
    if n and array.min() < 0:
        raise ValueError("ids must be >= 0 (-1 marks a missing result in search)")
    if np.unique(array).size != n:
        raise ValueError("ids must be unique")
    return np.ascontiguousarray(array)


# --- stored form (float64 in, float64 out) -------------------------------------------------------
def _uses_proxy(space: Space, kind: str) -> bool:
    """Hyperbolic IVF/HNSW use the MIPS-to-L2 augmented vectors (module docstring)."""
    return uses_mips(space, kind != "flat")


def _stored_form(x: np.ndarray, geometry: Geometry, kind: str) -> np.ndarray:
    """What the FAISS index stores for gallery rows ``x (N, D)``: their coordinates ``(N, D')`` (float64),
    hyperbolic IVF/HNSW with the MIPS-to-L2 column appended ``(N, D'+1)``."""
    coords = geometry.coordinates(x, hyperbolic_model="lorentz")
    return mips_gallery(coords) if _uses_proxy(geometry.space, kind) else coords


def _from_stored(stored: np.ndarray, geometry: Geometry, kind: str) -> np.ndarray:
    """Inverse of ``_stored_form`` up to the coordinates (float64): the MIPS-to-L2 column dropped and
    the Lorentz time recomputed from the space part (the stored rows are Lorentz points for both
    hyperbolic spaces)."""
    if not _uses_proxy(geometry.space, kind):
        return stored
    return Geometry(Space.LORENTZ, geometry.curv).coordinates(stored[:, :-1], hyperbolic_model="lorentz")


# --- the index ----------------------------------------------------------------------------------
@dataclass
class ShardIndex:
    """A FAISS index over one shard plus what is needed to search it in the right space.

    ``index`` is an ``IndexIDMap2`` around the flat / IVF / HNSW index; ``dim`` is the dimension of
    the embeddings and queries (``d+1`` for lorentz, ``d`` for poincare); ``curv`` is used by the
    hyperbolic spaces only. ``nprobe`` (IVF) and ``ef_search`` (HNSW) are the search parameters;
    ``refine_factor`` is the candidate over-fetch of the hyperbolic IVF/HNSW proxy search.
    """

    index: Any
    space: Space
    curv: float
    kind: str
    dim: int
    nprobe: int | None = None
    ef_search: int | None = None
    refine_factor: int = DEFAULT_REFINE_FACTOR
    _inner: Any = field(default=None, repr=False)

    @property
    def geometry(self) -> Geometry:
        """The index's space and curvature: its coordinates and distances."""
        return Geometry(self.space, self.curv)

    def __post_init__(self) -> None:
        if self._inner is None:
            self._inner = faiss.downcast_index(self.index.index)
        self.refine_factor = _check_positive_int(self.refine_factor, "refine_factor")
        self.set_search_params(nprobe=self.nprobe, ef_search=self.ef_search)

    # -- properties ------------------------------------------------------------------------------
    @property
    def ntotal(self) -> int:
        """Number of items in the index."""
        return int(self.index.ntotal)

    def set_search_params(self, nprobe: int | None = None, ef_search: int | None = None) -> None:
        """Change the IVF ``nprobe`` / HNSW ``efSearch`` used by later searches (None: keep)."""
        if nprobe is not None:
            if self.kind != "ivf":
                raise ValueError(f"nprobe applies to kind='ivf' only, this index is {self.kind!r}")
            nprobe = _check_positive_int(nprobe, "nprobe")
            self._inner.nprobe = min(nprobe, int(self._inner.nlist))
            self.nprobe = int(self._inner.nprobe)
        if ef_search is not None:
            if self.kind != "hnsw":
                raise ValueError(f"ef_search applies to kind='hnsw' only, this index is {self.kind!r}")
            self._inner.hnsw.efSearch = _check_positive_int(ef_search, "ef_search")
            self.ef_search = int(self._inner.hnsw.efSearch)

    # -- search ----------------------------------------------------------------------------------
    def _query_form(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(coordinates of the queries (float64), what FAISS is searched with (float32))."""
        coords = self.geometry.coordinates(queries, hyperbolic_model="lorentz")
        if self.space.hyperbolic:
            searched = coords.copy()
            searched[:, 0] = -searched[:, 0]  # [-q_t, q_s]: the FAISS inner product is <q,x>_L
            if _uses_proxy(self.space, self.kind):  # [-q_t, q_s, 0]: L2 order = geodesic order
                searched = mips_queries(searched)
        else:
            searched = coords
        return coords, np.ascontiguousarray(searched, dtype=np.float32)

    def search(self, queries: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest items of each query: ``(Q, D) -> distances (Q, k) float64, ids (Q, k) int64``.

        Rows are sorted by increasing distance (the space's retrieval distance, see the module
        docstring). Slots with no result hold id ``-1`` and distance ``+inf`` (e.g. ``k > ntotal``).
        """
        queries = _as_matrix(queries, "queries")
        if queries.shape[1] != self.dim:
            raise ValueError(
                f"queries must have dimension {self.dim} (this {self.space.value} index's dim), "
                f"got {queries.shape[1]}"
            )
        k = _check_positive_int(k, "k")
        n_queries = queries.shape[0]
        if n_queries == 0 or self.ntotal == 0:
            return np.full((n_queries, k), np.inf), np.full((n_queries, k), -1, dtype=np.int64)
        stored_queries, searched = self._query_form(queries)
        fetch = k
        if _uses_proxy(self.space, self.kind):
            fetch = max(k, min(k * self.refine_factor, self.ntotal))
        _, ids = self.index.search(searched, fetch)
        ids = np.asarray(ids, dtype=np.int64)
        found = ids >= 0
        distances = np.full(ids.shape, np.inf)
        if found.any():
            vectors = _from_stored(self.index.reconstruct_batch(ids[found]).astype(np.float64), self.geometry, self.kind)
            query_rows = np.broadcast_to(np.arange(n_queries)[:, None], ids.shape)[found]
            distances[found] = self.geometry.coordinate_distance(stored_queries[query_rows], vectors,
                                                                 hyperbolic_model="lorentz")
        order = np.argsort(distances, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(distances, order, axis=1), np.take_along_axis(ids, order, axis=1)

    # -- serialisation ---------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        """The JSON header written by ``to_bytes`` (without the checksum)."""
        return {
            "format_version": FORMAT_VERSION,
            "space": self.space.value,
            "curv": self.curv,
            "kind": self.kind,
            "dim": self.dim,
            "ntotal": self.ntotal,
            "nprobe": self.nprobe,
            "ef_search": self.ef_search,
            "refine_factor": self.refine_factor,
        }

    def to_bytes(self) -> bytes:
        """``container.pack_header(MAGIC, header)``, then ``faiss.serialize_index``'s bytes."""
        payload = faiss.serialize_index(self.index).tobytes()
        return pack_header(MAGIC, dict(self.header(), faiss_sha256=hashlib.sha256(payload).hexdigest())) + payload

    @classmethod
    def from_bytes(cls, data: bytes, whole_file_checked: bool = False) -> ShardIndex:
        """Inverse of ``to_bytes``; ValueError for anything that is not an intact serialised index.
        ``whole_file_checked``: the caller matched the sha256 of all of ``data`` against the one
        recorded when the file was written (``integrity.index_of_checked_bytes``), which covers
        the payload: its own checksum is not computed again."""
        data = bytes(data)
        header, offset = unpack_header(data, MAGIC, "ShardIndex", FORMAT_VERSION)
        payload = memoryview(data)[offset:]  # no copy: slicing the bytes copied them holding the GIL
        if not whole_file_checked and hashlib.sha256(payload).hexdigest() != header.get("faiss_sha256"):
            raise ValueError("data is corrupt or truncated: the FAISS payload checksum does not match")
        try:
            space = Space.parse(header["space"])
            kind = header["kind"]
            if kind not in KINDS:
                raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
            index = faiss.deserialize_index(np.frombuffer(payload, dtype=np.uint8))
            shard = cls(
                index=index,
                space=space,
                curv=_check_curv(header["curv"]),
                kind=kind,
                dim=int(header["dim"]),
                nprobe=header.get("nprobe"),
                ef_search=header.get("ef_search"),
                refine_factor=header.get("refine_factor", DEFAULT_REFINE_FACTOR),
            )
        except (KeyError, TypeError, RuntimeError) as exc:
            raise ValueError(f"data has an invalid ShardIndex header or payload: {exc!r}") from None
        if shard.ntotal != header.get("ntotal"):
            raise ValueError(f"header says ntotal={header.get('ntotal')}, index holds {shard.ntotal}")
        return shard

    def save(self, uri: str, storage_options: Mapping[str, Any] | None = None) -> None:
        """Write ``to_bytes()`` to ``uri`` atomically (local path, ``file://``, ``s3://`` ...)."""
        write_bytes_atomic(uri, self.to_bytes(), storage_options)

    @classmethod
    def load(cls, uri: str, storage_options: Mapping[str, Any] | None = None) -> ShardIndex:
        """Read an index written by ``save``; FileNotFoundError if absent, ValueError if corrupt."""
        data = read_bytes(uri, storage_options)
        try:
            return cls.from_bytes(data)
        except ValueError as exc:
            raise ValueError(f"{redact_uri(uri)}: {exc}") from None


# --- building -----------------------------------------------------------------------------------
def default_nlist(n: int) -> int:
    """IVF cells for ``n`` items: ``4 sqrt(n)``, capped so every cell gets >= 39 training points."""
    return max(1, min(int(round(4.0 * math.sqrt(n))), n // 39))


def build_index(
    embeddings: Any,
    space: Space | str,
    kind: IndexKind = "flat",
    ids: Any = None,
    *,
    curv: float = 1.0,
    nlist: int | None = None,
    nprobe: int | None = None,
    hnsw_m: int = 32,
    ef_construction: int = DEFAULT_EF_CONSTRUCTION,
    ef_search: int = DEFAULT_EF_SEARCH,
    refine_factor: int = DEFAULT_REFINE_FACTOR,
) -> ShardIndex:
    """Build a ``ShardIndex`` over ``embeddings (N, D)`` in ``space`` (see the module docstring).

    ``kind``: ``"flat"`` (exact, default), ``"ivf"`` (``nlist`` cells, default ``default_nlist(N)``;
    ``nprobe`` cells probed, default ``max(1, nlist // 4)``) or ``"hnsw"`` (``hnsw_m`` links per node,
    ``ef_construction`` / ``ef_search``); hyperbolic IVF/HNSW search MIPS-to-L2 augmented vectors and rank
    ``refine_factor * k`` candidates exactly (module docstring). ``ids (N,)``: unique non-negative int64 item ids returned by
    ``search`` (default ``0..N-1``). ``curv``: curvature ``K`` of the hyperbolic spaces (ignored by
    euclidean and cosine). Lorentz embeddings are full points ``(N, d+1)``, time first; Poincaré
    embeddings are ``(N, d)`` inside the ball of radius ``1/sqrt(K)``. IVF needs ``N >= nlist``.
    """
    space = Space.parse(space)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    curv = _check_curv(curv)
    embeddings = _as_matrix(embeddings, "embeddings")
    geometry = Geometry(space, curv)
    geometry.check_points(embeddings)
    n, dim = embeddings.shape
    item_ids = _check_ids(ids, n)
    hnsw_m = _check_positive_int(hnsw_m, "hnsw_m")

    refine_factor = _check_positive_int(refine_factor, "refine_factor")
    stored = np.ascontiguousarray(_stored_form(embeddings, geometry, kind), dtype=np.float32)
    stored_dim = stored.shape[1]
    l2 = space is Space.EUCLIDEAN or _uses_proxy(space, kind)
    metric = faiss.METRIC_L2 if l2 else faiss.METRIC_INNER_PRODUCT

    if kind == "flat":
        inner = faiss.IndexFlat(stored_dim, metric)
    elif kind == "hnsw":
        inner = faiss.IndexHNSWFlat(stored_dim, hnsw_m, metric)
        inner.hnsw.efConstruction = _check_positive_int(ef_construction, "ef_construction")
    else:
        nlist = default_nlist(n) if nlist is None else _check_positive_int(nlist, "nlist")
        if n < nlist:
            raise ValueError(f"kind='ivf' needs at least nlist={nlist} embeddings to train, got {n}")
        quantizer = faiss.IndexFlat(stored_dim, metric)
        inner = faiss.IndexIVFFlat(quantizer, stored_dim, nlist, metric)  # faiss keeps quantizer alive
        inner.train(stored)
    if nprobe is not None and kind != "ivf":
        raise ValueError(f"nprobe applies to kind='ivf' only, got kind={kind!r}")
    index = faiss.IndexIDMap2(inner)
    index.add_with_ids(stored, item_ids)
    if kind == "ivf":
        inner.make_direct_map()  # reconstruct-by-position for the distance refine step
        nprobe = max(1, inner.nlist // 4) if nprobe is None else nprobe
    return ShardIndex(
        index=index,
        space=space,
        curv=curv,
        kind=kind,
        dim=dim,
        nprobe=nprobe if kind == "ivf" else None,
        ef_search=ef_search if kind == "hnsw" else None,
        refine_factor=refine_factor,
        _inner=inner,
    )
