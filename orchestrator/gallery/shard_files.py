"""Gallery shard files: one Parquet file of embeddings per (shard, generation, item set).

Columns: ``id`` int64, ``label`` int64 (−1 when unknown), ``embedding`` fixed-size list of
float32 (width D; Lorentz points are full (d+1)-vectors, time first), ``uncertainty`` float32
(HBCT 1 − ‖h_s‖/h_t for Lorentz generations, NaN otherwise), ``generation`` string; then, when
known, ``row`` int64 (the item's row in the gallery source, to read it again for a backfill) and
the item's attributes: ``uri`` (its source file or object) and the metadata columns the gallery
names. The file's key-value metadata repeats the generation, its space and curvature, so a shard
file alone says how to search it.

Selection files (``write_selection``) hold the ids a partial backfill chose from one shard.

A shard's files are named by their content: ``shard-<index>/<generation>.<version>.parquet`` (and
``.index`` for its FAISS index), where the version is a hash of the sorted item ids. A re-run that
rebuilds the same shard writes the same names (idempotent); a shard that loses items to a
backfill gets new names, so the files the lineage points at are never overwritten in place.
Writes are atomic (``storage.write_bytes_atomic``) and return the sha256 the lineage records.
"""
from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.storage import ChecksumMismatch, join_uri, read_bytes, sha256_hex, write_bytes_atomic

_META_PREFIX = b"orchestrator."
_COLUMNS = ("id", "label", "embedding", "uncertainty", "generation", "row")


@dataclass(frozen=True)
class ShardEmbeddings:
    """The rows of one shard file.

    ids (n,) int64, labels (n,) int64, embeddings (n, D) float32, uncertainty (n,) float32;
    generation: the generation that embedded every row; space / curv: its embedding space;
    rows (n,) int64: each item's row in the gallery source (None: not recorded);
    attributes: an Arrow table of n rows (``uri`` and metadata columns), or None.
    """

    ids: np.ndarray
    labels: np.ndarray
    embeddings: np.ndarray
    uncertainty: np.ndarray
    generation: str
    space: str
    curv: float
    rows: np.ndarray | None = None
    attributes: pa.Table | None = None

    def __post_init__(self) -> None:
        n = len(self.ids)
        if self.embeddings.ndim != 2 or self.embeddings.shape[0] != n:
            raise ValueError(f"shard of {self.generation!r}: embeddings must be ({n}, D), got {self.embeddings.shape}")
        if self.labels.shape != (n,) or self.uncertainty.shape != (n,):
            raise ValueError(f"shard of {self.generation!r}: labels and uncertainty must be ({n},), got "
                             f"{self.labels.shape} and {self.uncertainty.shape}")
        if not all_distinct(self.ids):
            raise ValueError(f"shard of {self.generation!r}: item ids must be unique")
        if (self.rows is not None and self.rows.shape != (n,)) or (self.attributes is not None and len(self.attributes) != n):
            raise ValueError(f"shard of {self.generation!r}: rows and attributes must have {n} rows")

    def __len__(self) -> int:
        return len(self.ids)

    def sorted_by_id(self) -> ShardEmbeddings:
        order = np.argsort(self.ids, kind="stable")
        return self.take(order)

    def take(self, rows: np.ndarray) -> ShardEmbeddings:
        """The shard restricted to ``rows`` (positions, in the given order)."""
        return ShardEmbeddings(self.ids[rows], self.labels[rows], self.embeddings[rows], self.uncertainty[rows],
                               self.generation, self.space, self.curv,
                               None if self.rows is None else self.rows[rows],
                               None if self.attributes is None else self.attributes.take(pa.array(rows, type=pa.int64())))

    def restricted_to(self, item_ids: np.ndarray) -> ShardEmbeddings:
        """The shard's items among ``item_ids`` (in the shard's order)."""
        return self.take(np.flatnonzero(np.isin(self.ids, item_ids)))

    def without(self, item_ids: np.ndarray) -> ShardEmbeddings:
        """The shard minus the items ``item_ids`` (the rest keep their order)."""
        return self.take(np.flatnonzero(~np.isin(self.ids, item_ids)))


def all_distinct(ids: np.ndarray) -> bool:
    """Whether the (n,) ``ids`` are pairwise distinct: a scan when they increase (a shard's rows are
    sorted by id), a sort otherwise."""
    if ids.size < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return True
    return bool(np.unique(ids).size == ids.size)


def item_set_version(ids: np.ndarray) -> str:
    """12 hex characters identifying a set of item ids (order-free)."""
    return hashlib.sha256(np.sort(np.asarray(ids, dtype=np.int64)).tobytes()).hexdigest()[:12]


def shard_file_uris(gallery_root: str, index: int, generation: str, ids: np.ndarray) -> tuple[str, str]:
    """(Parquet URI, FAISS index URI) of shard ``index`` holding ``ids`` embedded by ``generation``."""
    stem = join_uri(gallery_root, f"shard-{index:05d}", f"{generation}.{item_set_version(ids)}")
    return stem + ".parquet", stem + ".index"


def shard_to_parquet(shard: ShardEmbeddings) -> bytes:
    """The Parquet bytes of ``shard`` (columns and metadata in the module docstring)."""
    embeddings = np.ascontiguousarray(shard.embeddings, dtype=np.float32)
    width = embeddings.shape[1]
    table = pa.table({
        "id": pa.array(np.asarray(shard.ids, dtype=np.int64)),
        "label": pa.array(np.asarray(shard.labels, dtype=np.int64)),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(embeddings.reshape(-1)), width),
        "uncertainty": pa.array(np.asarray(shard.uncertainty, dtype=np.float32)),
        "generation": pa.array([shard.generation] * len(shard), type=pa.string()),
    })
    if shard.rows is not None:
        table = table.append_column("row", pa.array(np.asarray(shard.rows, dtype=np.int64)))
    for name in [] if shard.attributes is None else shard.attributes.column_names:
        table = table.append_column(name, shard.attributes.column(name))
    metadata = {_META_PREFIX + b"generation": shard.generation.encode(), _META_PREFIX + b"space": shard.space.encode(),
                _META_PREFIX + b"curv": repr(float(shard.curv)).encode()}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def shard_from_parquet(data: bytes, uri: str = "<bytes>") -> ShardEmbeddings:
    """Parse shard Parquet bytes (ValueError naming ``uri`` when columns or metadata are missing)."""
    table = pq.read_table(io.BytesIO(data))
    metadata = table.schema.metadata or {}
    try:
        generation = metadata[_META_PREFIX + b"generation"].decode()
        space = metadata[_META_PREFIX + b"space"].decode()
        curv = float(metadata[_META_PREFIX + b"curv"].decode())
        column = table.column("embedding").combine_chunks()
        ids = table.column("id").to_numpy()
        labels = table.column("label").to_numpy()
        uncertainty = table.column("uncertainty").to_numpy()
    except KeyError as missing:
        raise ValueError(f"{uri}: not a gallery shard file (missing {missing})") from None
    width = column.type.list_size if len(table) else 0
    embeddings = column.flatten().to_numpy(zero_copy_only=False).reshape(len(table), width).astype(np.float32)
    if not math.isfinite(curv) or curv <= 0:
        raise ValueError(f"{uri}: curvature must be positive, got {curv}")
    rows = table.column("row").to_numpy().astype(np.int64) if "row" in table.column_names else None
    extra = [c for c in table.column_names if c not in _COLUMNS]
    return ShardEmbeddings(ids.astype(np.int64), labels.astype(np.int64), embeddings,
                           uncertainty.astype(np.float32), generation, space, curv, rows,
                           table.select(extra) if extra else None)


def write_shard(uri: str, shard: ShardEmbeddings, storage_options: Mapping[str, Any] | None = None) -> str:
    """Write ``shard`` to ``uri`` atomically; returns the file's sha256."""
    data = shard_to_parquet(shard)
    write_bytes_atomic(uri, data, storage_options)
    return sha256_hex(data)


def read_shard(uri: str, expected_sha256: str | None = None,
               storage_options: Mapping[str, Any] | None = None) -> ShardEmbeddings:
    """Read a shard file, checking its sha256 when given (``ChecksumMismatch`` otherwise)."""
    return shard_from_parquet(_checked_bytes(uri, expected_sha256, storage_options), uri)


def _checked_bytes(uri: str, expected_sha256: str | None, storage_options: Mapping[str, Any] | None) -> bytes:
    data = read_bytes(uri, storage_options)
    if expected_sha256 is not None:
        actual = sha256_hex(data)
        if actual != expected_sha256:
            raise ChecksumMismatch(uri, expected_sha256, actual)
    return data


def read_recorded_shard(record: Any, storage_options: Mapping[str, Any] | None = None) -> ShardEmbeddings:
    """The file of a shard the lineage records, its bytes checked against the sha256 it recorded
    (``ChecksumMismatch`` naming the file otherwise): the one reader of a served or planned shard's
    file. ``record``: anything with ``embeddings_uri`` and ``sha256`` (a lineage ``ShardRecord``, a
    plan's ``ShardBefore``)."""
    return read_shard(record.embeddings_uri, record.sha256, storage_options)


def read_recorded_attributes(record: Any, storage_options: Mapping[str, Any] | None = None
                             ) -> tuple[np.ndarray, pa.Table | None]:
    """(item ids (n,) int64, the item attribute columns or None) of a shard file the lineage
    records, its bytes checked as ``read_recorded_shard`` checks them, without decoding the
    embeddings, in the calling thread (Arrow's own threads would take the cores a server's
    searches run on while it builds a snapshot)."""
    data = _checked_bytes(record.embeddings_uri, record.sha256, storage_options)
    names = pq.ParquetFile(io.BytesIO(data)).schema_arrow.names
    if "id" not in names:
        raise ValueError(f"{record.embeddings_uri}: not a gallery shard file (missing 'id')")
    extra = [name for name in names if name not in _COLUMNS]
    table = pq.read_table(io.BytesIO(data), columns=["id", *extra], use_threads=False)
    return table.column("id").to_numpy().astype(np.int64), table.select(extra) if extra else None


def write_selection(uri: str, ids: np.ndarray, storage_options: Mapping[str, Any] | None = None) -> str:
    """Write the sorted item ids a backfill chose from one shard; returns the file's sha256."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(np.sort(np.asarray(ids, dtype=np.int64)))}), buffer)
    write_bytes_atomic(uri, buffer.getvalue(), storage_options)
    return sha256_hex(buffer.getvalue())


def read_selection(uri: str, expected_sha256: str, storage_options: Mapping[str, Any] | None = None) -> np.ndarray:
    """The ids of a selection file (sha256 checked)."""
    data = read_bytes(uri, storage_options)
    actual = sha256_hex(data)
    if actual != expected_sha256:
        raise ChecksumMismatch(uri, expected_sha256, actual)
    return pq.read_table(io.BytesIO(data)).column("id").to_numpy().astype(np.int64)
