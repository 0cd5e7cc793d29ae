"""The default store: a FAISS index file per shard beside its Parquet file, under the storage
(``gallery.shard_files``). Its files are listed and collected by ``verify``/``gc`` with the other
files of the storage; searching opens the index file checked against the lineage's hashes."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.storage.filesystem import read_bytes


@dataclass(frozen=True)
class ShardFileStore:
    """Shard index files under ``gallery_root`` (``index_kind``/``index_options``: the FAISS
    index built per shard, ``orchestrator.index.build_index``)."""

    gallery_root: str
    index_kind: str = "flat"
    index_options: Mapping[str, Any] = field(default_factory=dict)
    storage_options: Mapping[str, Any] | None = None
    kind: str = "files"

    def describe(self) -> str:
        return f"shard files under {self.gallery_root}"

    def check_reachable(self) -> None:
        return None  # the storage is checked before every command (outside.preflight)

    def write_shard(self, shard_index: int, shard, key: str, first_attempt: bool,
                    embeddings_uri: str | None = None) -> tuple[str, dict[str, Any]]:
        from orchestrator.gallery.shard_files import shard_file_uris
        from orchestrator.index import build_index
        from orchestrator.integrity import index_record
        from orchestrator.storage import write_bytes_atomic
        from orchestrator.storage.overwrite import refuse_file_on_first_attempt

        _embeddings, index_uri = shard_file_uris(self.gallery_root, shard_index, shard.generation, shard.ids)
        refuse_file_on_first_attempt(key, index_uri, first_attempt, self.storage_options)
        index = build_index(shard.embeddings, shard.space, self.index_kind, shard.ids, curv=shard.curv,
                            **dict(self.index_options)).to_bytes()
        write_bytes_atomic(index_uri, index, self.storage_options)
        return index_uri, index_record(index, shard.ids)

    def open_shard(self, uri: str, record: Mapping[str, Any] | None, n_items: int | None = None):
        from orchestrator.integrity import index_of_checked_bytes

        return index_of_checked_bytes(read_bytes(uri, self.storage_options), uri, record, n_items)

    def check_shard(self, uri: str, record: Mapping[str, Any] | None, n_items: int | None = None) -> None:
        from orchestrator.integrity import check_index_bytes

        check_index_bytes(read_bytes(uri, self.storage_options), uri, record, n_items)

    def locations(self) -> list[str]:
        return []  # the files are the storage's: verify lists and gc collects them with the others

    def remove(self, uris: Iterable[str]) -> None:
        from orchestrator.storage.filesystem import remove

        for uri in uris:
            remove(uri, missing_ok=True)
