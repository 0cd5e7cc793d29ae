"""What every vector store holds of a shard, and the exact re-rank of what it returns.

A store row holds the item's id, label, source URI and its *stored coordinates*: the float32
coordinates the exact shard index holds (``index.shard_index``, kind ``flat``):
``Geometry.coordinates(x, hyperbolic_model="lorentz")`` — the raw vector (euclidean), the
L2-normalised vector (cosine), the full hyperboloid point ``[x_t, x_s]`` (lorentz; poincaré points
mapped to it by the isometry).

Ranking inside the store:

* euclidean: the store's L2 distance;
* cosine: its inner product (negated) on the normalised rows;
* lorentz and poincaré: its inner product with the query's first coordinate's sign flipped,
  ``[-q_t, q_s] · [x_t, x_s] = <q, x>_L``, the Lorentz inner product. The geodesic distance
  ``arccosh(-K <q,x>_L) / sqrt(K)`` decreases as ``<q,x>_L`` grows, so the largest inner product
  is the nearest point: an exact max-inner-product search is an exact geodesic search.

An approximate index's graph or cells are built from gallery-gallery similarities, which on
hyperboloid points are Euclidean inner products, not Lorentz ones (an HNSW graph over them recalled
0.02 of the top-10 at 10⁵ points). So, as the shard index does (``index.mips``), a store with an
approximate index over a hyperbolic gallery also holds each row's *search coordinates*, the
MIPS→L2 form of its stored coordinates ``[x_t, x_s, sqrt(M² − |x|²)]`` (``M``: the largest norm of
the shard update's rows; ``search_rows``), builds its index on those and searches them with
``[-q_t, q_s, 0]`` (``search_metric``). All rows of a shard then have the norm ``M``, so for a query
the inner product ``q'·x' = <q, x>_L``, the L2 distance ``|q'|² + M² − 2<q, x>_L`` and the cosine
order the rows alike (geodesic order), and gallery-gallery similarities are those of points on a
sphere, which graphs and k-means handle. The store's index ranks them by *inner product*: the same
order as L2 for rows and pairs of rows, and a fair one for IVF cells, whose centroid's inner
product with the query is the mean of its members' (by L2, a spread-out cell's centroid, shorter
than ``M``, looks nearer than a tight cell's). Measured on 2·10⁴ Lorentz points (benchmarks'
gallery, 4 shards): recall@10 of pgvector IVFFlat 0.91 by L2, 1.00 by inner product; Lance
IVF_PQ 0.47 / 1.00 and IVF_HNSW_SQ 0.47 / 0.98; pgvector HNSW 1.00 either way.

A store returns ``overfetch · k`` candidates in that order (with an approximate index, what that
index found) with their stored coordinates; their distances are then computed here in float64 from
the stored float32 rows with the space's own distance (``Geometry.coordinate_distance``), exactly
as the shard index's refine step does, and the ``k`` nearest kept. With an exact scan the hits and
distances are those of the ``flat`` shard index.

Besides, a row of a non-Euclidean gallery holds its *raw* embedding (column ``raw``, float32: the
vector the model wrote, as the shard's Parquet file holds it), which a ``forward``-path route maps
through F: the stored coordinates are not it (cosine rows lost their norm, a Lorentz row's time
coordinate is recomputed, a Poincaré row is mapped to the hyperboloid). A Euclidean row's stored
coordinates are its raw embedding, so it holds no second copy.

The *columns* of a row (``row_columns``), in order: ``embedding``, then ``search`` (above), ``code``
(a binary ``gallery.index`` kind, ``stores.bits``) and ``raw``, those the gallery's space, store
index and kind call for. The lineage's record of a shard's rows names them (``columns``; a record
without it was written by the earlier layout, which held ``embedding`` alone). The digest of a
shard's rows (``rows_digest``) is what ``verify`` compares: sha256 over the ids sorted ascending
(int64 little-endian) followed by each column in that order, its rows in id order (float32
little-endian; ``code``: the packed bytes), so a changed value in any column is caught.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from orchestrator.errors import UsageError
from orchestrator.index.mips import mips_gallery, mips_queries, uses_mips
from orchestrator.integrity import IntegrityError


def stored_coordinates(embeddings: np.ndarray, space: str, curv: float) -> np.ndarray:
    """(N, D) embeddings → (N, D') float32 stored coordinates (module docstring)."""
    from orchestrator.geometry.geometry import Geometry

    coords = Geometry(space, curv).coordinates(np.ascontiguousarray(embeddings, dtype=np.float64),
                                               hyperbolic_model="lorentz")
    return np.ascontiguousarray(np.asarray(coords, dtype=np.float32))


def searches_mips(space: str, index: str) -> bool:
    """Whether a store with ``index`` (``exact`` or an approximate one) over a ``space`` gallery
    holds and searches the rows' search coordinates (module docstring; ``index.mips.uses_mips``)."""
    return uses_mips(space, index != "exact")


def search_rows(stored: np.ndarray) -> np.ndarray:
    """One shard update's stored coordinates (N, D') → its float32 search coordinates (N, D'+1),
    ``[x, sqrt(M² − |x|²)]`` (``index.mips.mips_gallery``)."""
    return np.ascontiguousarray(mips_gallery(stored), dtype=np.float32)


def search_metric(space: str, index: str) -> tuple[str, str]:
    """(column, ``"l2"`` or ``"dot"``) a store's search ranks by: the search coordinates
    (``searches_mips``) or else the stored coordinates, by L2 (euclidean) or by inner product."""
    return "search" if searches_mips(space, index) else "embedding", "l2" if space == "euclidean" else "dot"


def query_coordinates(queries: np.ndarray, space: str, curv: float,
                      index: str = "exact") -> tuple[np.ndarray, np.ndarray]:
    """(Q, D) queries → (their float64 coordinates (Q, D'), the float32 vectors the store ranks
    by: the coordinates, with the first one negated for the hyperbolic spaces, and a 0 appended
    (Q, D'+1) when ``index`` searches the search coordinates)."""
    from orchestrator.geometry.geometry import Geometry

    coords = np.asarray(Geometry(space, curv).coordinates(np.ascontiguousarray(queries, dtype=np.float64),
                                                          hyperbolic_model="lorentz"), dtype=np.float64)
    searched = coords.copy()
    if space in ("lorentz", "poincare"):
        searched[:, 0] = -searched[:, 0]
    if searches_mips(space, index):
        searched = mips_queries(searched)
    return coords, np.ascontiguousarray(searched, dtype=np.float32)


#: The columns a row may hold, in the digest's order (module docstring).
COLUMN_ORDER = ("embedding", "search", "code", "raw")
#: The columns of a record written before ``columns`` was recorded (the earlier layout).
EARLIER_LAYOUT = ("embedding",)


def row_columns(space: str, index: str, binary: bool = False) -> list[str]:
    """The columns a store row of a ``space`` gallery holds with store index ``index`` (``binary``:
    with a binary ``gallery.index`` kind's codes), in the digest's order (module docstring)."""
    wanted = {"embedding", "search" if searches_mips(space, index) and not binary else "",
              "code" if binary else "", "raw" if space != "euclidean" else ""}
    return [column for column in COLUMN_ORDER if column in wanted]


def recorded_columns(record: Mapping[str, Any]) -> list[str]:
    """The columns the lineage's ``record`` of a shard's rows says they hold (their digest's)."""
    return list(record.get("columns") or EARLIER_LAYOUT)


def missing_columns(record: Mapping[str, Any]) -> list[str]:
    """The columns the current layout gives rows like the recorded ones and the record lacks:
    non-empty for rows written by an earlier layout."""
    held = set(recorded_columns(record))
    return [column for column in row_columns(record["space"], record.get("index", "exact"), "binary" in record)
            if column not in held]


class EarlierLayout(UsageError, ValueError):
    """A shard's rows lack a column the current layout needs (one line naming them and what to run;
    exit 2: nothing was started)."""


def earlier_layout(where: str, missing: list[str], needed_for: str) -> EarlierLayout:
    return EarlierLayout(f"{where}: written by an earlier layout without the column(s) {', '.join(missing)} "
                         f"({needed_for}); run `orchestrator verify FILE --migrate-stores` to add and fill them in place")


def check_layout(where: str, record: Mapping[str, Any], needed: list[str], needed_for: str) -> None:
    """``EarlierLayout`` unless the rows ``record`` describes hold every column of ``needed``."""
    missing = [column for column in needed if column not in recorded_columns(record)]
    if missing:
        raise earlier_layout(where, missing, needed_for)


def rows_digest(ids: np.ndarray, *columns: np.ndarray) -> str:
    """sha256 (hex) of the rows: sorted ids, then each column's (N, ·) values in that order
    (float32, or uint8 codes as they are)."""
    ids = np.asarray(ids, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    digest = hashlib.sha256(ids[order].astype("<i8").tobytes())
    for values in columns:
        values = np.asarray(values)
        values = values if values.dtype == np.uint8 else values.astype("<f4")
        digest.update(np.ascontiguousarray(values[order]).tobytes())
    return digest.hexdigest()


def shard_columns(embeddings: np.ndarray, stored: np.ndarray, columns: list[str],
                  codes: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """One shard update's values of ``columns``: ``stored`` (N, D') coordinates, their search
    coordinates (N, D'+1), ``codes`` (N, C) uint8, the raw (N, D) float32 ``embeddings``."""
    values = {"embedding": stored, "code": codes,
              "raw": np.ascontiguousarray(np.asarray(embeddings, dtype=np.float32))}
    if "search" in columns:
        values["search"] = search_rows(stored)
    return {column: values[column] for column in columns}


def rerank(query_coords: np.ndarray, candidate_ids: list[np.ndarray], candidate_vectors: list[np.ndarray],
           k: int, space: str, curv: float) -> tuple[np.ndarray, np.ndarray]:
    """Per query its candidates (ids (m_q,), float32 stored rows (m_q, D')) → (distances (Q, k)
    float64 ascending, ids (Q, k) int64), +inf / −1 where fewer than k."""
    from orchestrator.geometry.geometry import Geometry

    geometry = Geometry(space, curv)
    exact = [np.asarray(geometry.coordinate_distance(np.broadcast_to(query_coords[q], vectors.shape),
                                                     vectors.astype(np.float64), hyperbolic_model="lorentz"),
                        dtype=np.float64).reshape(len(found))
             for q, (found, vectors) in enumerate(zip(candidate_ids, candidate_vectors))]
    return nearest(candidate_ids, exact, k)


def nearest(candidate_ids: list[np.ndarray], candidate_distances: list[np.ndarray],
            k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query its candidates' ids and float64 distances (m_q,) → the ``k`` nearest: (distances
    (Q, k) ascending, ties by id, ids (Q, k) int64), +inf / −1 where fewer than k."""
    n = len(candidate_ids)
    distances, ids = np.full((n, k), np.inf), np.full((n, k), -1, dtype=np.int64)
    for q, (found, found_distances) in enumerate(zip(candidate_ids, candidate_distances)):
        order = np.lexsort((found, found_distances))[:k]
        distances[q, :len(order)], ids[q, :len(order)] = found_distances[order], found[order]
    return distances, ids


def check_servable(where: str, record: Mapping[str, Any] | None, held: int) -> None:
    """``IntegrityError`` unless a store's rows at ``where`` (``held`` of them) may be served: the
    lineage holds their record and it counts as many rows."""
    if record is None:
        raise IntegrityError(f"{where}: the lineage holds no record of these rows; refusing to serve them "
                             "(run `orchestrator verify FILE`)")
    if held != int(record["n_items"]):
        raise IntegrityError(f"{where}: holds {held} rows, the lineage recorded {record['n_items']}; refusing to "
                             "serve it (run `orchestrator verify FILE`)")


def check_rows(where: str, record: Mapping[str, Any] | None, ids: np.ndarray, columns: Mapping[str, np.ndarray]) -> None:
    """``verify``'s check of a store's rows at ``where`` against the lineage's ``record``: the row
    count and the digest of ids and the recorded columns (``rows_digest``; ``columns``: column →
    (N, ·) values in the order of ``ids``); ``FileNotFoundError`` when none are left;
    ``verify`` then asks ``check_current_layout``."""
    if record is None:
        raise IntegrityError(f"{where}: the lineage holds no record of these rows")
    if not len(ids) and int(record["n_items"]):
        raise FileNotFoundError(f"{where}: no rows")
    if len(ids) != int(record["n_items"]):
        raise IntegrityError(f"{where}: {len(ids)} rows, the lineage recorded {record['n_items']} "
                             "(rows missing or added)")
    actual = rows_digest(ids, *(columns[column] for column in recorded_columns(record)))
    if actual != record["sha256"]:
        raise IntegrityError(f"{where}: rows changed since they were written (a vector of "
                             f"{'/'.join(recorded_columns(record))} or an id): digest {actual}, the lineage holds "
                             f"{record['sha256']}")


def check_current_layout(where: str, record: Mapping[str, Any]) -> None:
    """``EarlierLayout`` when the rows ``record`` describes lack a column of the current layout."""
    missing = missing_columns(record)
    if missing:
        raise earlier_layout(where, missing, "searched by the store's index or mapped by a forward path")


def check_stored_rows(store, uri: str, where: str, record: Mapping[str, Any] | None) -> None:
    """``verify``'s check of a row store's shard at ``uri`` (described as ``where``): its rows read
    with the columns the lineage's ``record`` names and checked against it (``check_rows``), then
    their layout against the current one (``check_current_layout``)."""
    check_rows(where, record, *store.read_rows(uri, recorded_columns(record or {})))
    check_current_layout(where, record or {})


def raw_column(space: str) -> str:
    """The column holding a row's raw embedding: ``raw``, or a Euclidean row's ``embedding``."""
    return "embedding" if space == "euclidean" else "raw"


def read_checked_embeddings(store, uri: str, record: Mapping[str, Any] | None) -> tuple[np.ndarray, np.ndarray]:
    """(ids (N,) ascending, raw float32 embeddings (N, D)) of a store's rows at ``uri`` (what a
    forward path maps through F, as the shard's file holds them), read with every column the
    lineage's ``record`` names and checked against it (count and digest: ``check_rows``);
    ``EarlierLayout`` when the rows hold no raw embeddings."""
    from orchestrator.stores.locations import StoreLocation

    where = StoreLocation.parse(uri).describe()
    if record is None:
        raise IntegrityError(f"{where}: the lineage holds no record of these rows; refusing to serve them "
                             "(run `orchestrator verify FILE`)")
    raw = raw_column(record["space"])
    check_layout(where, record, [raw], "the raw embeddings a forward path maps through F")
    ids, columns = store.read_rows(uri, recorded_columns(record))
    check_rows(where, record, ids, columns)
    return ids, columns[raw]
