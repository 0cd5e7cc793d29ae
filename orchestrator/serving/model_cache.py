"""The models a server holds, reused across snapshots while the lineage's hashes of them hold.

A snapshot swap (a shard commit, a deployment, a rollback) needs the serving generation's model
and those of the generations its shards hold; most are the models the last snapshot served.
``ModelCache.load(record)`` returns the model of a lineage generation row, loaded and checked
(``integrity.load_checked_generation``) only when no model is held under its key: the generation,
its checkpoint URI, the weights' sha256 and the card's sha256 as the lineage holds them now. A
changed hash is a new key, so a rewritten checkpoint is loaded again, never served stale. At most
``capacity`` models are held, the least recently used dropped first.
"""
from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.lineage import LineageStore
    from orchestrator.lineage.records import GenerationRecord

#: Models one server process holds at most.
MODEL_CAPACITY = 8

ModelKey = tuple[str, str | None, str | None, str | None]


class ModelCache:
    """Checked models by ``key`` (module docstring); thread-safe."""

    def __init__(self, store: LineageStore, capacity: int = MODEL_CAPACITY):
        self.store, self.capacity = store, capacity
        self._models: collections.OrderedDict[ModelKey, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0

    def key(self, record: GenerationRecord) -> ModelKey:
        """(name, checkpoint URI, weights sha256, card sha256) of a generation row, as recorded now."""
        from orchestrator.integrity import recorded_card_sha256

        return record.name, record.checkpoint_uri, record.sha256, recorded_card_sha256(self.store, record.name)

    def held(self, key: ModelKey) -> Any | None:
        """The model held under ``key``, or None."""
        with self._lock:
            return self._models.get(key)

    def load(self, record: GenerationRecord) -> Any:
        """The model of generation row ``record``: the held one under its key, or loaded and checked."""
        from orchestrator.integrity import load_checked_generation

        key = self.key(record)
        with self._lock:  # one load at a time: two snapshots never load one model twice
            if key not in self._models:
                self._models[key] = load_checked_generation(self.store, record)[0]
                self.loads += 1
            self._models.move_to_end(key)
            while len(self._models) > self.capacity:
                self._models.popitem(last=False)
            return self._models[key]
