"""The store's one boundary between absolute locations and the relative ones it records.

A store opened with ``storage=`` (the pipeline's storage root, ``LineageStore(url, storage=...)``)
records every location under that root relative to it (``storage:<path>``,
``orchestrator.storage.locations``): generation checkpoints, shard files, the locations in step
outputs and specs, and the location in a step key (``integrity:<index uri>``). Everything the store
returns is resolved against the root again, so callers only ever see absolute locations, and a
storage moved or copied together with its lineage works from its new place when the next command
is given the new root.

A writer given a root records it (table ``settings``, ``storage_root``); a store opened without one
resolves against that recorded root (what the lineage's last run was given), so a tool that only
knows the lineage URL sees the same locations as the run. Rows written before locations were
relative keep their absolute locations and are read as they are; a step is found under either form
of its key, and takes the relative one when it is written again.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from sqlalchemy import Engine, inspect, or_, select
from sqlalchemy.orm import Session

from orchestrator.lineage.rows import clean_json
from orchestrator.lineage.schema import Setting, Step, utcnow
from orchestrator.lineage.sessions import StoreSessions
from orchestrator.lineage.step_keys import map_location
from orchestrator.storage.locations import StorageRoot

#: The ``settings`` row holding the storage root the last writer given one had.
STORAGE_ROOT = "storage_root"
#: Fields of the store's records (and of ``ShardAssignment``) that hold a location.
LOCATION_FIELDS = ("checkpoint_uri", "embeddings_uri", "index_uri", "source_uri")
_UNREAD = object()


def find_step(session: Session, keys: Sequence[str], *, lock: bool = False) -> Optional[Step]:
    """The row of a step under any of its key forms (``keys``, the stored form first), preferring
    the earlier form; None if there is none."""
    stmt = select(Step).where(Step.key.in_(list(keys)))
    rows = session.scalars(stmt.with_for_update() if lock else stmt).all()
    return min(rows, key=lambda row: keys.index(row.key), default=None)


class StoreLocations(StoreSessions):
    """Relative locations on the way in, absolute ones on the way out (module docstring)."""

    engine: Engine
    _given_root: Optional[StorageRoot]
    _root_cache: Any = _UNREAD

    def _init_locations(self, storage: Optional[str], readonly: bool) -> None:
        """Take the storage root this store is given; a writer records it."""
        self._given_root = None if storage is None else StorageRoot(str(storage))
        self._root_cache = self._given_root if self._given_root is not None else _UNREAD
        if self._given_root is not None and not readonly:
            self._record_root(self._given_root.uri)

    def _record_root(self, uri: str) -> None:
        def fn(session: Session) -> None:
            row = session.get(Setting, STORAGE_ROOT, with_for_update=True)
            if row is None:
                session.add(Setting(name=STORAGE_ROOT, value=uri, updated_at=utcnow()))
            elif row.value != uri:
                row.value, row.updated_at = uri, utcnow()
        StoreSessions._write(self, fn)

    @property
    def storage_root(self) -> Optional[StorageRoot]:
        """The root locations resolve against: the one given, else the one the lineage recorded."""
        if self._root_cache is _UNREAD:
            recorded = None
            if inspect(self.engine).has_table(Setting.__tablename__):  # a reader of a store not migrated yet
                recorded = StoreSessions._read(self, lambda s: s.scalar(select(Setting.value).where(
                    Setting.name == STORAGE_ROOT)))
            self._root_cache = None if recorded is None else StorageRoot(recorded)
        return self._root_cache

    # --- on the way in ---------------------------------------------------------------------------
    def _stored(self, value: Any) -> Any:
        """JSON ``value`` (outputs, a spec, a location) as it is recorded: locations under the root relative."""
        root = self.storage_root
        value = clean_json(value)
        return value if root is None else root.relative_json(value)

    def _key_forms(self, key: str) -> tuple[str, ...]:
        """The forms step ``key`` may be recorded under: relative to the root first, then as given."""
        root = self.storage_root
        stored = key if root is None else map_location(key, root.relative)
        return (stored,) if stored == key else (stored, key)

    def _key_prefix_filter(self, prefix: str):
        """A filter on ``Step.key`` starting with ``prefix`` in either form."""
        return or_(*(Step.key.startswith(form, autoescape=True) for form in self._key_forms(prefix)))

    def _stored_assignment(self, assignment):
        """A ``ShardAssignment`` with its locations as recorded."""
        return dataclasses.replace(assignment, **{name: self._stored(getattr(assignment, name)) for name in
                                                  LOCATION_FIELDS if hasattr(assignment, name)})

    # --- on the way out --------------------------------------------------------------------------
    def _resolved(self, result: Any) -> Any:
        """A store method's result (records, lists of them) with every location absolute."""
        if isinstance(result, list):
            return [self._resolved(item) for item in result]
        if not dataclasses.is_dataclass(result) or isinstance(result, type):
            return result
        root = self.storage_root
        if root is None:
            return result
        changes = {name: root.resolve(getattr(result, name)) for name in LOCATION_FIELDS if hasattr(result, name)}
        if hasattr(result, "outputs"):
            changes["outputs"] = root.resolve_json(result.outputs)
            changes["key"] = map_location(result.key, root.resolve)
        return dataclasses.replace(result, **changes) if changes else result

    def _read(self, fn):
        return self._resolved(StoreSessions._read(self, fn))

    def _read_as_recorded(self, fn):
        return StoreSessions._read(self, fn)

    def _write(self, fn):
        return self._resolved(StoreSessions._write(self, fn))
