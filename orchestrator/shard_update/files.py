"""Writing one shard: its Parquet embeddings (the lineage's record of its items) under a
content-addressed name (``gallery.shard_files.shard_file_uris``), never over a file the lineage
does not know, and its searched vectors into the gallery's store (``orchestrator.stores``): by
default a FAISS index file beside the Parquet file, else staged rows of a pgvector or Lance store.

The returned ``WrittenShard`` is what the lineage records of the shard: the Parquet URI and
sha256, the index URI (a file, or the store location of the rows) and its record
(``integrity.index_record`` for a file: the index bytes' sha256, the id set's sha256 and size; a
store's record: the rows' digest, the id set's sha256 and size). It holds no item.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.gallery.shard_files import ShardEmbeddings, shard_file_uris, shard_to_parquet
from orchestrator.storage import sha256_hex, write_bytes_atomic
from orchestrator.storage.overwrite import refuse_file_on_first_attempt
from orchestrator.stores.protocol import GalleryStore


@dataclass(frozen=True)
class ShardTarget:
    """Where and how a gallery's shard files are written.

    gallery_root:  the gallery's folder (``<storage>/galleries/<name>``);
    index_kind / index_options: the FAISS index built per shard (``orchestrator.index.build_index``);
    storage_options: fsspec options of the storage (None: the environment's);
    store: the gallery's store (``orchestrator.stores``; None: the shard files, a FAISS index file
                   per shard).
    """

    gallery_root: str
    index_kind: str = "flat"
    index_options: Mapping[str, Any] = field(default_factory=dict)
    storage_options: Mapping[str, Any] | None = None
    store: GalleryStore | None = None

    def gallery_store(self) -> GalleryStore:
        """The store the shards' searched vectors are written to."""
        if self.store is not None:
            return self.store
        from orchestrator.stores.files import ShardFileStore

        return ShardFileStore(self.gallery_root, self.index_kind, dict(self.index_options), self.storage_options)


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
    its searched vectors into the gallery's store (the index file built over it, or the store's
    staged rows). On the first attempt of step ``key`` an existing file (or rows) at either name is
    refused (``storage.overwrite``); a later attempt rewrites what an earlier one left."""
    embeddings_uri, index_uri = shard_file_uris(target.gallery_root, shard_index, shard.generation, shard.ids)
    store = target.gallery_store()
    for uri in (embeddings_uri, index_uri) if store.kind == "files" else (embeddings_uri,):
        refuse_file_on_first_attempt(key, uri, first_attempt, target.storage_options)
    data = shard_to_parquet(shard)
    write_bytes_atomic(embeddings_uri, data, target.storage_options)
    index_uri, record = store.write_shard(shard_index, shard, key, first_attempt)
    return WrittenShard(shard_index, shard.generation, embeddings_uri, sha256_hex(data), index_uri, record, len(shard))
