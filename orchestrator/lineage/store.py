"""The lineage store: which generation exists, what it was trained with, which gallery shard it
embedded, how compatible it is with its ancestors, which one serves, and which pipeline steps
have committed.

Backends
    ``LineageStore("sqlite:////abs/path/lineage.db")`` (the default: one file under the storage
    root; parent directories are created), a plain filesystem path (same thing), ``"sqlite://"``
    (in memory, tests), or any SQLAlchemy URL such as ``postgresql+psycopg://…`` (a bare
    ``postgresql://`` means psycopg 3, the ``postgres`` extra). A writer's open creates or upgrades
    the schema through the Alembic migrations (``migrate.py``; serialised, a no-op when current).
    ``readonly=True`` opens for reading only: a store that does not exist raises
    ``LineageNotFound`` and nothing is created (no folder, file, WAL file or table).

    ``LineageStore(url, storage=root)``: locations under the pipeline's storage root are recorded
    relative to it and resolved against the root given, so a storage moved or copied with its
    lineage keeps working (``locations.py``).

    ``store.run_lock(pipeline, purpose)`` (``locks.py``) keeps two runs of one pipeline apart: the
    second raises ``LineageBusy`` naming the holder.

    On SQLite every connection gets WAL journaling (readers never block the writer and vice
    versa), a busy timeout (a second writer waits instead of failing) and foreign keys. The
    store takes over BEGIN from the sqlite3 driver: writes run in ``BEGIN IMMEDIATE`` (the write
    lock is taken up front, so select-then-insert/update cannot race another process), reads in a
    deferred ``BEGIN`` (one consistent snapshot). On PostgreSQL, write selects use
    ``SELECT … FOR UPDATE`` and a write that loses an insert race (IntegrityError on a unique
    constraint) is retried once in a fresh transaction, where it finds the row and updates it.

Idempotency
    Every method may be called again with the same arguments and leaves the same rows: natural
    keys (generation name, gallery name, (gallery, shard index), (query, gallery, metric,
    dataset), step key) are UNIQUE, and writes are select-then-update-or-insert inside one
    transaction. Re-assigning a shard to the generation it already holds records no backfill;
    deploying the generation that already serves adds no deployment row.

Write protocol (for callers; DESIGN.md "Lineage data model")
    1. ``store.start_step(key)``; if it returns ``status == "committed"`` skip the step and
       use ``record.outputs`` (or use ``store.run_step(key, fn)``, which does all of this).
    2. Write the step's files first, each to a temporary name and then renamed (or committed
       through the object store) into place; a killed writer leaves at most an orphan temp file.
    3. Record the result in ONE transaction, together with the step commit where possible:
       ``mark_generation_trained(..., step=key, step_outputs=...)``,
       ``assign_shard(..., step=key)``, ``record_compatibility(rows, step=key)``,
       ``deploy(gen, step=key)``; or ``with store.transaction() as session: ...``.
    A crash before 3 commits leaves the old state (the step row says ``started``; the re-run
    bumps ``attempts`` and redoes it, overwriting the files); a crash after leaves the new one.
    Never a half: no row points at a file that was not completely written.

All methods return frozen dataclasses from :mod:`orchestrator.lineage.records`, never live ORM
objects. Unknown generation or gallery names raise ``LookupError`` naming them.

Layout
    ``LineageStore`` is this facade over one mixin per concern, each in its own module:
    ``steps`` (pipeline runs and steps), ``generations`` (generations and compatibility values),
    ``galleries`` (galleries, shards and backfills), ``candidates`` (sweep candidates) and
    ``deployments``; ``sessions`` holds the engine and transactions, ``locations`` the translation
    between absolute and recorded (storage-relative) locations, ``rows`` the row lookups and record
    builders they share.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.lineage import locks, migrate
from orchestrator.lineage.candidates import CandidatesMixin
from orchestrator.lineage.deployments import DeploymentsMixin
from orchestrator.lineage.errors import LineageNotFound
from orchestrator.lineage.galleries import GalleriesMixin
from orchestrator.lineage.generations import GenerationsMixin
from orchestrator.lineage.rows import clean_json
from orchestrator.lineage.schema import Base
from orchestrator.lineage.sessions import WRITE_OPTION, make_engine, normalise_url, sqlite_in_memory
from orchestrator.lineage.steps import STEP_SPEC, StepsMixin

__all__ = ["STEP_SPEC", "LineageStore", "clean_json", "normalise_url"]


class LineageStore(StepsMixin, GenerationsMixin, GalleriesMixin, CandidatesMixin, DeploymentsMixin):
    """Generations, galleries and shards, backfills, compatibility values, deployments and
    pipeline steps in one SQL database (SQLite by default, any SQLAlchemy URL).

    Safe to open from several processes at once (each process its own ``LineageStore``);
    not meant to be pickled into Ray tasks — pass the URL and open a store there.
    """

    def __init__(self, url: str | os.PathLike | URL, *, storage: str | os.PathLike | None = None,
                 readonly: bool = False, follows_writers: bool = False, busy_timeout_s: float = 30.0,
                 echo: bool = False):
        self.url = normalise_url(url)
        self.readonly = readonly
        self.engine = make_engine(self.url, busy_timeout_s, echo, readonly, follows_writers)
        self._write_engine = self.engine.execution_options(**{WRITE_OPTION: True})
        self._read_sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(self._write_engine, expire_on_commit=False)
        sqlite_file = self.url.database if self.url.get_backend_name() == "sqlite" and not sqlite_in_memory(self.url) \
            else None
        self._locks = locks.RunLocks(self, sqlite_file)
        if readonly:
            self._check_exists()
        else:
            migrate.upgrade(self.engine, self._write_engine)
        self._init_locations(None if storage is None else os.fspath(storage), readonly)

    @classmethod
    def under(cls, root: str | os.PathLike, filename: str = "lineage.db", **kwargs: Any) -> "LineageStore":
        """The default store: a SQLite file ``filename`` under the local directory ``root``."""
        return cls(Path(root) / filename, **kwargs)

    def __repr__(self) -> str:
        return f"LineageStore({self.url.render_as_string(hide_password=True)!r})"

    def close(self) -> None:
        """Release pooled connections (the store can still be used; it reconnects)."""
        self.engine.dispose()

    def __enter__(self) -> "LineageStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_exists(self) -> None:
        with self.engine.connect() as connection:
            found = migrate.state(connection)
        if found is None:
            self.close()
            raise LineageNotFound(f"no lineage store at {self.url.render_as_string(hide_password=True)} "
                                  "(the database has no lineage tables)")

    def run_lock(self, pipeline: str, purpose: str):
        """``with store.run_lock(pipeline, "orchestrator run"):`` — this process alone runs
        ``pipeline`` on this store until the block ends (reentrant); ``LineageBusy`` naming the
        holder when another process has it. See ``locks.py``."""
        return self._locks.hold(pipeline, purpose)

    def row_counts(self) -> dict[str, int]:
        """Rows per table (tests and ``orchestrator lineage --json`` diagnostics)."""
        from sqlalchemy import func

        def fn(session: Session) -> dict[str, int]:
            return {t.name: int(session.scalar(select(func.count()).select_from(t)) or 0)
                    for t in Base.metadata.sorted_tables}
        return self._read(fn)
