"""Hashes the lineage holds for everything served, and the loaders that check them.

The lineage already holds the sha256 of a generation's weights (``generations.sha256``) and of a
shard's Parquet file (``shards.sha256``). This module adds, without new tables or columns:

* the sha256 of a generation's whole ``card.json`` (the card rebuilds the model: ``clip``,
  curvature, adapters…), in the outputs of its ``train:<gen>`` step (``CARD_SHA256``);
* per index file: the sha256 of the whole file (header included), the sha256 of the sorted id set
  it was built from and its item count, as a committed lineage step ``integrity:<index uri>``
  (``index_steps``), committed in the transaction that points the shard row at it.

``load_checked_generation`` and ``load_checked_index`` refuse (``IntegrityError``, one line naming
the file, the expected and the actual hash) anything that is not what the lineage recorded, or
that the lineage holds no hash for.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from orchestrator.errors import StoredFileError
from orchestrator.lineage.step_keys import integrity_key, train_key
from orchestrator.models.checkpoint_layout import CARD_FILE, WEIGHTS_FILE
from orchestrator.storage.filesystem import join_uri, read_bytes, redact_uri

#: Key of the train step's output holding the card's sha256.
CARD_SHA256 = "card_sha256"
#: Key of the ``evaluate:<gen>`` step's outputs holding ``{"uri", "sha256", "items"}`` of the
#: generation's stored evaluation embeddings.
EVAL_EMBEDDINGS = "eval_embeddings"


class IntegrityError(StoredFileError, RuntimeError):
    """A stored file does not match (or has no) hash in the lineage (the CLI's exit code 1)."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ids_sha256(ids: Any) -> str:
    """The sha256 of an id set: the sorted ids as little-endian int64 (order does not matter)."""
    return sha256_bytes(np.sort(np.asarray(ids, dtype=np.int64)).astype("<i8").tobytes())


def card_sha256(checkpoint_uri: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """The sha256 of the card file of the checkpoint folder ``checkpoint_uri``."""
    return sha256_bytes(read_bytes(join_uri(checkpoint_uri, CARD_FILE), storage_options))


def trained_outputs(checkpoint_uri: str, weights_sha256: str) -> dict[str, Any]:
    """The outputs of a ``train:<gen>`` step: the checkpoint, its weights' and its card's sha256."""
    return {"checkpoint_uri": checkpoint_uri, "sha256": weights_sha256, CARD_SHA256: card_sha256(checkpoint_uri)}


def index_record(data: bytes, ids: Any) -> dict[str, Any]:
    """What the lineage holds of an index file: its bytes' sha256, its id set's sha256 and size."""
    return {"kind": "index", "sha256": sha256_bytes(data), "ids_sha256": ids_sha256(ids), "n_items": int(len(ids))}


def index_steps(indexes: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The lineage steps recording index files just written, ``(uri, index_record)`` each →
    ``integrity_key(uri)`` → the record, for ``assign_shard(s)(..., with_steps=...)`` to commit in
    the transaction that points shards at them (the record is computed where the file was written,
    from its bytes: the lineage's side reads nothing)."""
    return {integrity_key(uri): dict(record) for uri, record in indexes}


def recorded_index(store, uri: str) -> dict[str, Any] | None:
    """The hashes the lineage holds for the index file ``uri`` (None: none)."""
    return store.committed_outputs(integrity_key(uri))


def check_index_bytes(data: bytes, uri: str, record: Mapping[str, Any] | None, n_items: int | None) -> None:
    """IntegrityError unless ``data`` (read from ``uri``) is the index the lineage recorded, over
    exactly the shard's ``n_items`` items."""
    if record is None:
        raise IntegrityError(f"{redact_uri(uri)}: the lineage holds no hash of this index file; refusing to serve it "
                             "(run `orchestrator verify FILE` to see what the lineage knows)")
    actual = sha256_bytes(data)
    if actual != record["sha256"]:
        raise IntegrityError(f"{redact_uri(uri)}: index file changed since it was written: sha256 {actual}, "
                             f"the lineage holds {record['sha256']}")
    if n_items is not None and int(record["n_items"]) != int(n_items):
        raise IntegrityError(f"{redact_uri(uri)}: the index holds {record['n_items']} items, the lineage's shard "
                             f"{n_items}")


def load_checked_index(store, shard, storage_options: Mapping[str, Any] | None = None):
    """The index of lineage shard row ``shard``, its bytes checked against the lineage's hashes
    (a shard whose rows a store holds: ``stores.load_checked_shard``)."""
    data = read_bytes(shard.index_uri, storage_options)
    return index_of_checked_bytes(data, shard.index_uri, recorded_index(store, shard.index_uri), shard.n_items)


def index_of_checked_bytes(data: bytes, uri: str, record: Mapping[str, Any] | None, n_items: int | None):
    """The index in ``data`` (read from ``uri``), once ``check_index_bytes`` found the whole file
    to be the one the lineage recorded: its FAISS payload is not hashed a second time
    (``ShardIndex.from_bytes``), ~90 ms of CPU for a 250,000-item HNSW shard on these cores."""
    from orchestrator.index.factory import index_from_bytes

    check_index_bytes(data, uri, record, n_items)
    return index_from_bytes(data, whole_file_checked=True)


def recorded_card_sha256(store, generation: str) -> str | None:
    """The card sha256 the lineage holds for ``generation`` (its train step's outputs), or None."""
    outputs = store.committed_outputs(train_key(generation)) or {}
    return outputs.get(CARD_SHA256)


def check_card(store, record, storage_options: Mapping[str, Any] | None = None) -> None:
    """IntegrityError unless the card of generation ``record`` is byte for byte the recorded one."""
    expected = recorded_card_sha256(store, record.name)
    uri = join_uri(record.checkpoint_uri, CARD_FILE)
    if expected is None:
        raise IntegrityError(f"{redact_uri(uri)}: the lineage holds no hash of generation {record.name!r}'s card; "
                             "refusing to load it")
    actual = card_sha256(record.checkpoint_uri, storage_options)
    if actual != expected:
        raise IntegrityError(f"{redact_uri(uri)}: card of generation {record.name!r} changed since training: "
                             f"sha256 {actual}, the lineage holds {expected}")


def check_checkpoint(store, record, storage_options: Mapping[str, Any] | None = None) -> None:
    """IntegrityError unless generation ``record``'s card and weights are the ones the lineage recorded."""
    check_card(store, record, storage_options)
    uri = join_uri(record.checkpoint_uri, WEIGHTS_FILE)
    actual = sha256_bytes(read_bytes(uri, storage_options))
    if actual != record.sha256:
        raise IntegrityError(f"{redact_uri(uri)}: weights of generation {record.name!r} changed since training: "
                             f"sha256 {actual}, the lineage holds {record.sha256}")


def load_checked_generation(store, record, storage_options: Mapping[str, Any] | None = None, **kwargs: Any):
    """``load_generation`` of lineage generation ``record``: its card's and its weights' sha256
    checked against the lineage first. Returns ``(model, card)``."""
    if record.checkpoint_uri is None:
        raise IntegrityError(f"generation {record.name!r} has no checkpoint in the lineage (status {record.status})")
    from orchestrator.methods.loading import load_generation  # torch: only where a model is loaded

    check_card(store, record, storage_options)
    return load_generation(record.checkpoint_uri, expected_sha256=record.sha256, storage_options=storage_options,
                           **kwargs)
