"""Gallery stores: where a gallery's searched vectors live (``protocol.GalleryStore``;
docs/stores.md). ``store_of(spec, gallery_root, gallery)`` is the configured store of a gallery,
``store_at(uri)`` the store a lineage location names (readers: search, serve, verify, gc,
rollback need nothing but the lineage). Nothing here imports Ray or torch."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.index.protocol import ShardSearch
from orchestrator.stores.locations import StoreLocation, is_store_uri
from orchestrator.stores.protocol import GalleryStore, RowStore


def store_of(spec, gallery_root: str, gallery: str, index_kind: str = "flat",
             index_options: Mapping[str, Any] | None = None) -> GalleryStore:
    """The store a gallery's ``store:`` section (``config.gallery.StoreSpec``) configures;
    ``index_kind``/``index_options``: ``gallery.index`` and its options (a pgvector store carries
    the codes of a binary kind, ``stores.bits``; the shard files build that index)."""
    kind = getattr(spec, "kind", "files") if spec is not None else "files"
    if kind == "pgvector":
        from orchestrator.stores.pgvector import PgVectorStore

        binary = index_kind if index_kind != "flat" else None
        return PgVectorStore(spec.url, spec.table or f"orchestrator_{gallery.lower().replace('-', '_').replace('.', '_')}"[:40],
                             spec.index, dict(spec.index_options), spec.overfetch, binary,
                             dict(index_options or {}) if binary else {})
    if kind == "lance":
        from orchestrator.storage import join_uri
        from orchestrator.stores.lance import LanceStore

        return LanceStore(spec.path or join_uri(gallery_root, "lance"), spec.index, dict(spec.index_options),
                          spec.overfetch)
    from orchestrator.stores.files import ShardFileStore

    return ShardFileStore(gallery_root, index_kind, dict(index_options or {}))


def store_at(uri: str, record: Mapping[str, Any] | None = None) -> RowStore:
    """The store holding the location ``uri`` (its search settings from the lineage's ``record``)."""
    location = StoreLocation.parse(uri)
    record = record or {}
    if location.scheme == "pgvector":
        from orchestrator.stores.pgvector import PgVectorStore

        prefix = location.table.rsplit("__", 1)[0]
        return PgVectorStore(location.where, prefix, record.get("index", "exact"),
                             dict(record.get("index_options") or {}), int(record.get("overfetch", 4)))
    from orchestrator.stores.lance import LanceStore

    return LanceStore(location.where, record.get("index", "exact"), dict(record.get("index_options") or {}),
                      int(record.get("overfetch", 4)))


def load_checked_shard(lineage, shard, storage_options: Mapping[str, Any] | None = None) -> ShardSearch:
    """What the router searches of lineage shard row ``shard``: the rows of its store (their count
    checked against the lineage's record), or its index file (its bytes checked against the
    lineage's hashes, ``integrity.load_checked_index``)."""
    from orchestrator.integrity import load_checked_index, recorded_index

    if is_store_uri(shard.index_uri):
        record = recorded_index(lineage, shard.index_uri)
        return store_at(shard.index_uri, record).open_shard(shard.index_uri, record, shard.n_items)
    return load_checked_index(lineage, shard, storage_options)


def read_checked_embeddings(lineage, shard, storage_options: Mapping[str, Any] | None = None):
    """(ids (N,), float32 embeddings (N, D)) of lineage shard row ``shard`` as its generation's
    model wrote them (what a forward path maps through F): from its store's rows (count and
    digest checked against the lineage's record, ``stores.vectors.read_checked_embeddings``), or
    from its shard file (sha256 checked against the lineage's row)."""
    if is_store_uri(shard.index_uri):
        from orchestrator.integrity import recorded_index
        from orchestrator.stores.vectors import read_checked_embeddings as read_store

        record = recorded_index(lineage, shard.index_uri)
        return read_store(store_at(shard.index_uri, record), shard.index_uri, record)
    from orchestrator.gallery.shard_files import read_recorded_shard

    stored = read_recorded_shard(shard, storage_options)
    return stored.ids, stored.embeddings


__all__ = ["StoreLocation", "is_store_uri", "load_checked_shard", "read_checked_embeddings", "store_at", "store_of"]
