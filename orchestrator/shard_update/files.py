"""Writing one shard's files: its Parquet embeddings and its FAISS index, under content-addressed
names (``gallery.shard_files.shard_file_uris``), never over a file the lineage does not know.

The returned ``WrittenShard`` is what the lineage records of the shard: the two URIs, the
Parquet file's sha256, the index record (``integrity.index_record``: the index bytes' sha256, the
id set's sha256 and size). It holds no item.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.gallery.shard_files import ShardEmbeddings, shard_file_uris, shard_to_parquet
from orchestrator.index import build_index
from orchestrator.integrity import index_record
from orchestrator.storage import sha256_hex, write_bytes_atomic
from orchestrator.storage.overwrite import refuse_file_on_first_attempt


@dataclass(frozen=True)
class ShardTarget:
    """Where and how a gallery's shard files are written.

    gallery_root:  the gallery's folder (``<storage>/galleries/<name>``);
    index_kind / index_options: the FAISS index built per shard (``orchestrator.index.build_index``);
    storage_options: fsspec options of the storage (None: the environment's).
    """

    gallery_root: str
    index_kind: str = "flat"
    index_options: Mapping[str, Any] = field(default_factory=dict)
    storage_options: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class WrittenShard:
    """The files of one shard as written: shard index, generation, Parquet URI and sha256, index
    URI and its record (``integrity.index_record``), item count. JSON-able, a few hundred bytes."""

    shard: int
    generation: str
    embeddings_uri: str
    sha256: str
    index_uri: str
    index_record: dict[str, Any]
    n_items: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_shard_files(shard_index: int, shard: ShardEmbeddings, target: ShardTarget, key: str,
                      first_attempt: bool) -> WrittenShard:
    """Write ``shard`` as shard ``shard_index`` of ``target``'s gallery: Parquet file first, then
    the index built over it. On the first attempt of step ``key`` an existing file at either name
    is refused (``storage.overwrite``); a later attempt rewrites what an earlier one left."""
    embeddings_uri, index_uri = shard_file_uris(target.gallery_root, shard_index, shard.generation, shard.ids)
    for uri in (embeddings_uri, index_uri):
        refuse_file_on_first_attempt(key, uri, first_attempt, target.storage_options)
    data = shard_to_parquet(shard)
    write_bytes_atomic(embeddings_uri, data, target.storage_options)
    index = build_index(shard.embeddings, shard.space, target.index_kind, shard.ids, curv=shard.curv,
                        **dict(target.index_options)).to_bytes()
    write_bytes_atomic(index_uri, index, target.storage_options)
    return WrittenShard(shard_index, shard.generation, embeddings_uri, sha256_hex(data), index_uri,
                        index_record(index, shard.ids), len(shard))
