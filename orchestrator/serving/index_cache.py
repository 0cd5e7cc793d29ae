"""The shard indexes a server holds, reused across snapshots while the lineage's hashes of them hold.

``IndexCache.load(shard)`` returns the index of a lineage shard row, loaded and checked against the
lineage (``stores.load_checked_shard``: an index file, or a store's rows) only when none is held under its key: the index URI and
the sha256 the lineage records for it now, so a rewritten index is loaded again, never served
stale. ``keep(uris)`` forgets every index whose URI no current shard row names. The single-process
server (``serving.local``) and every shard-search replica (``serving.shares``) hold theirs here.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.lineage import LineageStore
    from orchestrator.lineage.records import ShardRecord


class IndexCache:
    """Checked shard indexes by (index URI, recorded sha256) (module docstring)."""

    def __init__(self, store: LineageStore):
        self.store = store
        self._indexes: dict[tuple[str, str | None], Any] = {}
        self.loads = 0

    def load(self, shard: ShardRecord) -> Any:
        """The index of shard row ``shard``: the held one under its key, or loaded and checked."""
        from orchestrator.integrity import recorded_index
        from orchestrator.stores import load_checked_shard

        key = (shard.index_uri, (recorded_index(self.store, shard.index_uri) or {}).get("sha256"))
        if key not in self._indexes:
            self._indexes[key] = load_checked_shard(self.store, shard)
            self.loads += 1
        return self._indexes[key]

    def keep(self, uris: Iterable[str]) -> None:
        """Forget the indexes whose URI is not in ``uris``."""
        uris = set(uris)
        for key in [key for key in self._indexes if key[0] not in uris]:
            del self._indexes[key]
