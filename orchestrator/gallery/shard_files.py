"""Gallery shard files: one Parquet file of embeddings per (shard, generation, item set).

Columns: ``id`` int64, ``label`` int64 (−1 when unknown), ``embedding`` fixed-size list of
float32 (width D; Lorentz points are full (d+1)-vectors, time first), ``uncertainty`` float32
(HBCT 1 − ‖h_s‖/h_t for Lorentz generations, NaN otherwise), ``generation`` string. The file's
key-value metadata repeats the generation, its space and curvature, so a shard file alone says
how to search it.

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


@dataclass(frozen=True)
class ShardEmbeddings:
    """The rows of one shard file.

    ids (n,) int64, labels (n,) int64, embeddings (n, D) float32, uncertainty (n,) float32;
    generation: the generation that embedded every row; space / curv: its embedding space.
    """

    ids: np.ndarray
    labels: np.ndarray
    embeddings: np.ndarray
    uncertainty: np.ndarray
    generation: str
    space: str
    curv: float

    def __post_init__(self) -> None:
        n = len(self.ids)
        if self.embeddings.ndim != 2 or self.embeddings.shape[0] != n:
            raise ValueError(f"shard of {self.generation!r}: embeddings must be ({n}, D), got {self.embeddings.shape}")
        if self.labels.shape != (n,) or self.uncertainty.shape != (n,):
            raise ValueError(f"shard of {self.generation!r}: labels and uncertainty must be ({n},), got "
                             f"{self.labels.shape} and {self.uncertainty.shape}")
        if np.unique(self.ids).size != n:
            raise ValueError(f"shard of {self.generation!r}: item ids must be unique")

    def __len__(self) -> int:
        return len(self.ids)

    def sorted_by_id(self) -> ShardEmbeddings:
        order = np.argsort(self.ids, kind="stable")
        return self.take(order)

    def take(self, rows: np.ndarray) -> ShardEmbeddings:
        """The shard restricted to ``rows`` (positions, in the given order)."""
        return ShardEmbeddings(self.ids[rows], self.labels[rows], self.embeddings[rows], self.uncertainty[rows],
                               self.generation, self.space, self.curv)

    def without(self, item_ids: np.ndarray) -> ShardEmbeddings:
        """The shard minus the items ``item_ids`` (the rest keep their order)."""
        return self.take(np.flatnonzero(~np.isin(self.ids, item_ids)))


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
    return ShardEmbeddings(ids.astype(np.int64), labels.astype(np.int64), embeddings,
                           uncertainty.astype(np.float32), generation, space, curv)


def write_shard(uri: str, shard: ShardEmbeddings, storage_options: Mapping[str, Any] | None = None) -> str:
    """Write ``shard`` to ``uri`` atomically; returns the file's sha256."""
    data = shard_to_parquet(shard)
    write_bytes_atomic(uri, data, storage_options)
    return sha256_hex(data)


def read_shard(uri: str, expected_sha256: str | None = None,
               storage_options: Mapping[str, Any] | None = None) -> ShardEmbeddings:
    """Read a shard file, checking its sha256 when given (``ChecksumMismatch`` otherwise)."""
    data = read_bytes(uri, storage_options)
    if expected_sha256 is not None:
        actual = sha256_hex(data)
        if actual != expected_sha256:
            raise ChecksumMismatch(uri, expected_sha256, actual)
    return shard_from_parquet(data, uri)
