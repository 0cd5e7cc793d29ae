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
"""
from __future__ import annotations

import math
import os
import traceback
import urllib.parse
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, TypeVar

from sqlalchemy import Engine, create_engine, event, select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from orchestrator.lineage import locks, migrate
from orchestrator.lineage.errors import LineageNotFound
from orchestrator.lineage.records import (
    BackfillRecord,
    CandidateRecord,
    CompatibilityRecord,
    DeploymentRecord,
    GalleryRecord,
    GenerationRecord,
    RunRecord,
    ShardAssignment,
    ShardRecord,
    StepRecord,
)
from orchestrator.lineage.schema import (
    CANDIDATE_OUTCOMES,
    GENERATION_STATUSES,
    Backfill,
    Base,
    Candidate,
    Compatibility,
    Deployment,
    Gallery,
    Generation,
    PipelineRun,
    Shard,
    Step,
    utcnow,
)

T = TypeVar("T")

_WRITE_OPTION = "lineage_write"
_WRITE_RETRIES = 2  # one retry after an insert race (IntegrityError) on backends without a table lock
# SQLAlchemy's own default driver, psycopg2, is not installed; "postgres" is an alias SQLAlchemy 2 dropped.
_DEFAULT_DRIVERS = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg"}
STEP_SPEC = "spec"  # the key of a step's outputs that holds what it ran from (``start_step(spec=...)``)


# --------------------------------------------------------------------------- helpers

def _aware(value: Optional[datetime]) -> Optional[datetime]:
    """SQLite stores datetimes without offset; everything this store writes is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


def clean_json(value: Any) -> Any:
    """``value`` as plain JSON data: non-finite floats → None (PostgreSQL's JSON rejects NaN),
    tuples/sets → lists, numpy/torch scalars and arrays → Python values, paths → strings."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(clean_json(v) for v in value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "tolist"):  # numpy / torch scalars and arrays
        return clean_json(value.tolist())
    raise TypeError(f"lineage: {type(value).__name__} value is not JSON-serialisable: {value!r}")


def _float_or_none(value: Any) -> Optional[float]:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _assign(obj: Any, **fields: Any) -> bool:
    """Set only the fields that differ; True when anything changed."""
    changed = False
    for name, value in fields.items():
        if getattr(obj, name) != value:
            setattr(obj, name, value)
            changed = True
    return changed


def _missing(kind: str, names: Iterable[str]) -> LookupError:
    names = sorted(set(names))
    return LookupError(f"unknown {kind}{'s' if len(names) > 1 else ''}: {', '.join(names)}")


def normalise_url(url: str | os.PathLike) -> URL:
    """A SQLAlchemy URL, or a filesystem path → ``sqlite:///<absolute path>``; ``postgresql://``
    → ``postgresql+psycopg://``."""
    if not isinstance(url, URL):
        text = os.fspath(url)
        if "://" not in text:
            return URL.create("sqlite", database=str(Path(text).expanduser().resolve()))
        url = make_url(text)
    return url.set(drivername=_DEFAULT_DRIVERS.get(url.drivername, url.drivername))


def _sqlite_in_memory(url: URL) -> bool:
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database


def _readonly_sqlite(url: URL) -> URL:
    """The URL of an existing SQLite file opened read-only (``mode=ro``); LineageNotFound when
    there is none: checked before connecting, since connecting would create the file."""
    path = Path(url.database or "").expanduser()
    if _sqlite_in_memory(url) or not path.is_file():
        raise LineageNotFound(f"no lineage store at {url.render_as_string(hide_password=True)} (no such file)")
    return url.set(database=f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro", query={"uri": "true"})


def _make_engine(url: URL, busy_timeout_s: float, echo: bool, readonly: bool) -> Engine:
    if not url.get_backend_name() == "sqlite":
        connect_args = {"options": "-c default_transaction_read_only=on"} if readonly else {}
        return create_engine(url, echo=echo, pool_pre_ping=True, connect_args=connect_args)

    in_memory = _sqlite_in_memory(url)
    kwargs: dict[str, Any] = {"echo": echo, "connect_args": {"timeout": busy_timeout_s}}
    if readonly:
        url = _readonly_sqlite(url)
    elif in_memory:
        # One shared connection, or every pooled connection would see its own empty database.
        kwargs["poolclass"] = StaticPool
        kwargs["connect_args"]["check_same_thread"] = False
    elif url.database and not url.database.startswith("file:"):
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        # Take BEGIN away from the sqlite3 driver (its legacy mode does not BEGIN before SELECT,
        # which breaks select-then-update atomicity); _on_begin emits our own.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if not in_memory and not readonly:
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:
        write = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


# --------------------------------------------------------------------------- the store

class LineageStore:
    """Generations, galleries and shards, backfills, compatibility values, deployments and
    pipeline steps in one SQL database (SQLite by default, any SQLAlchemy URL).

    Safe to open from several processes at once (each process its own ``LineageStore``);
    not meant to be pickled into Ray tasks — pass the URL and open a store there.
    """

    def __init__(self, url: str | os.PathLike | URL, *, readonly: bool = False, busy_timeout_s: float = 30.0,
                 echo: bool = False):
        self.url = normalise_url(url)
        self.readonly = readonly
        self.engine = _make_engine(self.url, busy_timeout_s, echo, readonly)
        self._write_engine = self.engine.execution_options(**{_WRITE_OPTION: True})
        self._read_sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(self._write_engine, expire_on_commit=False)
        sqlite_file = self.url.database if self.url.get_backend_name() == "sqlite" and not _sqlite_in_memory(self.url) \
            else None
        self._locks = locks.RunLocks(self, sqlite_file)
        if readonly:
            self._check_exists()
        else:
            migrate.upgrade(self.engine, self._write_engine)

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

    # ------------------------------------------------------------------ transactions

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """``with store.transaction() as session:`` — one write transaction; commits on exit,
        rolls back everything on an exception (no partial rows). ORM objects must not escape it."""
        with self._write_sessions() as session, session.begin():
            yield session

    def _write(self, fn: Callable[[Session], T]) -> T:
        for attempt in range(_WRITE_RETRIES):
            try:
                with self.transaction() as session:
                    return fn(session)
            except IntegrityError:
                if attempt == _WRITE_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _read(self, fn: Callable[[Session], T]) -> T:
        with self._read_sessions() as session, session.begin():
            return fn(session)

    # ------------------------------------------------------------------ row lookups

    @staticmethod
    def _generation(session: Session, name: str, *, lock: bool = False) -> Generation:
        stmt = select(Generation).where(Generation.name == name)
        row = session.scalars(stmt.with_for_update() if lock else stmt).one_or_none()
        if row is None:
            raise _missing("generation", [name])
        return row

    @staticmethod
    def _generations_by_name(session: Session, names: Iterable[str]) -> dict[str, Generation]:
        names = set(names)
        rows = session.scalars(select(Generation).where(Generation.name.in_(names))).all() if names else []
        found = {row.name: row for row in rows}
        if names - set(found):
            raise _missing("generation", names - set(found))
        return found

    @staticmethod
    def _gallery(session: Session, name: str) -> Gallery:
        row = session.scalars(select(Gallery).where(Gallery.name == name)).one_or_none()
        if row is None:
            raise _missing("gallery", [name])
        return row

    @staticmethod
    def _names(session: Session) -> dict[int, str]:
        return dict(session.execute(select(Generation.id, Generation.name)).all())

    # ------------------------------------------------------------------ record builders

    @staticmethod
    def _generation_record(row: Generation, names: Mapping[int, str]) -> GenerationRecord:
        return GenerationRecord(
            id=row.id, name=row.name, parent=names.get(row.parent_id) if row.parent_id else None,
            method=row.method, params=dict(row.params or {}), arch=row.arch, space=row.space,
            curv=row.curv, checkpoint_uri=row.checkpoint_uri, sha256=row.sha256, status=row.status,
            metrics=dict(row.metrics or {}), created_at=_aware(row.created_at),
            updated_at=_aware(row.updated_at),
        )

    @staticmethod
    def _step_record(row: Step) -> StepRecord:
        return StepRecord(
            key=row.key, status=row.status, attempts=row.attempts, outputs=dict(row.outputs or {}),
            error=row.error, started_at=_aware(row.started_at), finished_at=_aware(row.finished_at),
        )

    @staticmethod
    def _shard_record(row: Shard, gallery: str, names: Mapping[int, str]) -> ShardRecord:
        return ShardRecord(
            gallery=gallery, index=row.index, n_items=row.n_items,
            generation=names.get(row.generation_id) if row.generation_id else None,
            embeddings_uri=row.embeddings_uri, index_uri=row.index_uri, sha256=row.sha256,
            updated_at=_aware(row.updated_at),
        )

    @staticmethod
    def _backfill_record(row: Backfill, gallery: str, shard_index: int, names: Mapping[int, str]) -> BackfillRecord:
        return BackfillRecord(
            id=row.id, gallery=gallery, shard_index=shard_index,
            from_generation=names.get(row.from_generation_id) if row.from_generation_id else None,
            to_generation=names[row.to_generation_id], items=row.items, status=row.status,
            started_at=_aware(row.started_at), finished_at=_aware(row.finished_at),
        )

    @staticmethod
    def _gallery_record(row: Gallery) -> GalleryRecord:
        return GalleryRecord(name=row.name, source_uri=row.source_uri, n_items=row.n_items, n_shards=row.n_shards)

    # ------------------------------------------------------------------ pipeline runs

    def register_run(self, pipeline: str, config_sha256: str) -> RunRecord:
        """Note an invocation of ``pipeline`` with this config: one row per (pipeline, config),
        ``invocations`` counts how often it was (re)started."""
        def fn(session: Session) -> RunRecord:
            row = session.scalars(
                select(PipelineRun).where(PipelineRun.pipeline == pipeline, PipelineRun.config_sha256 == config_sha256)
                .with_for_update()
            ).one_or_none()
            now = utcnow()
            if row is None:
                row = PipelineRun(pipeline=pipeline, config_sha256=config_sha256, invocations=1,
                                  created_at=now, last_started_at=now)
                session.add(row)
            else:
                row.invocations += 1
                row.last_started_at = now
            session.flush()
            return RunRecord(row.pipeline, row.config_sha256, row.invocations,
                             _aware(row.created_at), _aware(row.last_started_at))
        return self._write(fn)

    def runs(self) -> list[RunRecord]:
        def fn(session: Session) -> list[RunRecord]:
            rows = session.scalars(select(PipelineRun).order_by(PipelineRun.id)).all()
            return [RunRecord(r.pipeline, r.config_sha256, r.invocations, _aware(r.created_at),
                              _aware(r.last_started_at)) for r in rows]
        return self._read(fn)

    # ------------------------------------------------------------------ steps

    def get_step(self, key: str) -> Optional[StepRecord]:
        def fn(session: Session) -> Optional[StepRecord]:
            row = session.scalars(select(Step).where(Step.key == key)).one_or_none()
            return None if row is None else self._step_record(row)
        return self._read(fn)

    def step_status(self, key: str) -> Optional[str]:
        """``"started"``, ``"committed"``, ``"failed"``, or None for a step never started."""
        step = self.get_step(key)
        return None if step is None else step.status

    def start_step(self, key: str, *, rerun: bool = False, spec: Optional[Mapping[str, Any]] = None) -> StepRecord:
        """Record that step ``key`` starts. A new key gets one row (attempts=1); a started or
        failed one (a crash or an error last time) is reset to started with attempts+1. A
        committed step is left alone and returned as is — the caller skips it — unless
        ``rerun=True``, which restarts it like a failed one. ``spec`` (JSON: what the step runs
        from) is kept with its outputs under ``STEP_SPEC`` when it commits."""
        started_outputs = {} if spec is None else {STEP_SPEC: clean_json(dict(spec))}

        def fn(session: Session) -> StepRecord:
            row = session.scalars(select(Step).where(Step.key == key).with_for_update()).one_or_none()
            now = utcnow()
            if row is None:
                row = Step(key=key, status="started", attempts=1, outputs=started_outputs, started_at=now)
                session.add(row)
            elif row.status != "committed" or rerun:
                row.attempts += 1
                row.status = "started"
                row.outputs = started_outputs
                row.error = None
                row.started_at = now
                row.finished_at = None
            session.flush()
            return self._step_record(row)
        return self._write(fn)

    @staticmethod
    def _commit_step_in(session: Session, key: str, outputs: Optional[Mapping[str, Any]]) -> Step:
        outputs = clean_json(dict(outputs or {}))
        row = session.scalars(select(Step).where(Step.key == key).with_for_update()).one_or_none()
        now = utcnow()
        if row is not None and STEP_SPEC in (row.outputs or {}) and STEP_SPEC not in outputs:
            outputs[STEP_SPEC] = row.outputs[STEP_SPEC]  # what the step ran from, recorded at its start
        if row is None:  # committed without a recorded start: one attempt
            row = Step(key=key, status="committed", attempts=1, outputs=outputs, started_at=now, finished_at=now)
            session.add(row)
        elif row.status != "committed" or row.outputs != outputs:
            _assign(row, status="committed", outputs=outputs, error=None)
            row.finished_at = now
        session.flush()
        return row

    def commit_step(self, key: str, outputs: Optional[Mapping[str, Any]] = None) -> StepRecord:
        """Mark step ``key`` committed with its (JSON) outputs, e.g. URIs of the files it wrote —
        which must already be in place. Committing a committed step with the same outputs
        changes nothing."""
        return self._write(lambda session: self._step_record(self._commit_step_in(session, key, outputs)))

    def fail_step(self, key: str, error: str | BaseException) -> StepRecord:
        """Mark step ``key`` failed with an error text (an exception is stored with its traceback).
        A committed step cannot fail afterwards (ValueError)."""
        if isinstance(error, BaseException):
            error = "".join(traceback.format_exception(type(error), error, error.__traceback__))

        def fn(session: Session) -> StepRecord:
            row = session.scalars(select(Step).where(Step.key == key).with_for_update()).one_or_none()
            now = utcnow()
            if row is None:
                row = Step(key=key, status="failed", attempts=1, outputs={}, error=error, started_at=now, finished_at=now)
                session.add(row)
            elif row.status == "committed":
                raise ValueError(f"step {key!r} is already committed; it cannot fail")
            else:
                row.status, row.error, row.finished_at = "failed", error, now
            session.flush()
            return self._step_record(row)
        return self._write(fn)

    def committed_outputs(self, key: str) -> Optional[dict[str, Any]]:
        """The outputs of a committed step, or None when ``key`` has not committed."""
        step = self.get_step(key)
        return dict(step.outputs) if step is not None and step.status == "committed" else None

    def run_step(self, key: str, fn: Callable[[], Optional[Mapping[str, Any]]]) -> dict[str, Any]:
        """Run ``fn`` as step ``key`` unless it already committed: start → fn() (writes its files,
        returns outputs) → commit. An exception marks the step failed and propagates.
        Returns the committed outputs (the recorded ones when skipped)."""
        step = self.start_step(key)
        if step.status == "committed":
            return dict(step.outputs)
        try:
            outputs = fn()
        except BaseException as exc:
            self.fail_step(key, exc)
            raise
        return dict(self.commit_step(key, outputs).outputs)

    def steps(self, prefix: Optional[str] = None) -> list[StepRecord]:
        def fn(session: Session) -> list[StepRecord]:
            stmt = select(Step).order_by(Step.id)
            if prefix:
                stmt = stmt.where(Step.key.startswith(prefix, autoescape=True))
            return [self._step_record(row) for row in session.scalars(stmt)]
        return self._read(fn)

    # ------------------------------------------------------------------ generations

    def upsert_generation(
        self,
        name: str,
        parent: Optional[str] = None,
        method: Optional[str] = None,
        params: Optional[Mapping[str, Any]] = None,
        arch: Optional[str] = None,
        space: Optional[str] = None,
        curv: Optional[float] = None,
        status: Optional[str] = None,
    ) -> GenerationRecord:
        """Create generation ``name`` (status ``pending`` unless given) or update it. On update,
        arguments left as None keep the recorded value. A trained generation's definition
        (parent, method, params, arch, space, curv) is frozen: a different value raises
        ValueError — train it under a new name. Unknown parent → LookupError."""
        if status is not None and status not in GENERATION_STATUSES:
            raise ValueError(f"generation status must be one of {GENERATION_STATUSES}, got {status!r}")
        if parent is not None and parent == name:
            raise ValueError(f"generation {name!r} cannot be its own parent")
        clean_params = None if params is None else clean_json(dict(params))
        clean_curv = None if curv is None else float(curv)

        def fn(session: Session) -> GenerationRecord:
            parent_row = self._generation(session, parent) if parent is not None else None
            row = session.scalars(select(Generation).where(Generation.name == name).with_for_update()).one_or_none()
            now = utcnow()
            if row is None:
                row = Generation(
                    name=name, parent_id=parent_row.id if parent_row else None, method=method,
                    params=clean_params or {}, arch=arch, space=space, curv=clean_curv,
                    status=status or "pending", metrics={}, created_at=now, updated_at=now,
                )
                session.add(row)
            else:
                wanted: dict[str, Any] = {
                    "parent_id": parent_row.id if parent_row else None, "method": method,
                    "params": clean_params, "arch": arch, "space": space, "curv": clean_curv,
                }
                wanted = {k: v for k, v in wanted.items() if v is not None}
                if parent_row is not None:
                    self._check_no_cycle(session, row, parent_row)
                if row.status == "trained":
                    differ = sorted(k for k, v in wanted.items() if getattr(row, k) != v)
                    if differ:
                        fields = ", ".join("parent" if k == "parent_id" else k for k in differ)
                        raise ValueError(
                            f"generation {name!r} is already trained with a different {fields}; "
                            "record the new model under a new generation name"
                        )
                if status is not None:
                    wanted["status"] = status
                if _assign(row, **wanted):
                    row.updated_at = now
            session.flush()
            return self._generation_record(row, self._names(session))
        return self._write(fn)

    @staticmethod
    def _check_no_cycle(session: Session, row: Generation, parent_row: Generation) -> None:
        parent_of = dict(session.execute(select(Generation.id, Generation.parent_id)).all())
        cursor: Optional[int] = parent_row.id
        while cursor is not None:
            if cursor == row.id:
                raise ValueError(f"making {parent_row.name!r} the parent of {row.name!r} would create a cycle")
            cursor = parent_of.get(cursor)

    def set_generation_status(self, name: str, status: str) -> GenerationRecord:
        """Set the status (``training`` when a train step starts, ``failed`` when it fails)."""
        if status not in GENERATION_STATUSES:
            raise ValueError(f"generation status must be one of {GENERATION_STATUSES}, got {status!r}")

        def fn(session: Session) -> GenerationRecord:
            row = self._generation(session, name, lock=True)
            if _assign(row, status=status):
                row.updated_at = utcnow()
            session.flush()
            return self._generation_record(row, self._names(session))
        return self._write(fn)

    def mark_generation_trained(
        self,
        name: str,
        checkpoint_uri: str,
        sha256: Optional[str] = None,
        metrics: Optional[Mapping[str, Any]] = None,
        *,
        step: Optional[str] = None,
        step_outputs: Optional[Mapping[str, Any]] = None,
    ) -> GenerationRecord:
        """Record the finished checkpoint (already written and renamed into place): status
        ``trained``, checkpoint URI and sha256, ``metrics`` merged into the recorded ones.
        With ``step``, that step commits in the same transaction."""
        clean_metrics = clean_json(dict(metrics or {}))

        def fn(session: Session) -> GenerationRecord:
            row = self._generation(session, name, lock=True)
            merged = {**(row.metrics or {}), **clean_metrics}
            if _assign(row, status="trained", checkpoint_uri=checkpoint_uri, sha256=sha256, metrics=merged):
                row.updated_at = utcnow()
            if step is not None:
                self._commit_step_in(session, step, step_outputs if step_outputs is not None
                                     else {"checkpoint_uri": checkpoint_uri, "sha256": sha256})
            session.flush()
            return self._generation_record(row, self._names(session))
        return self._write(fn)

    def get_generation(self, name: str) -> GenerationRecord:
        return self._read(lambda session: self._generation_record(self._generation(session, name), self._names(session)))

    def has_generation(self, name: str) -> bool:
        return self._read(lambda s: s.scalar(select(Generation.id).where(Generation.name == name)) is not None)

    def list_generations(self) -> list[GenerationRecord]:
        """All generations, parents before children: depth-first from the roots, siblings in
        creation order (so each subtree is contiguous, the order a tree is drawn in)."""
        def fn(session: Session) -> list[GenerationRecord]:
            rows = session.scalars(select(Generation).order_by(Generation.id)).all()
            names = {row.id: row.name for row in rows}
            children: dict[Optional[int], list[Generation]] = {}
            for row in rows:
                parent = row.parent_id if row.parent_id in names else None
                children.setdefault(parent, []).append(row)
            ordered: list[GenerationRecord] = []
            stack = list(reversed(children.get(None, [])))
            while stack:
                row = stack.pop()
                ordered.append(self._generation_record(row, names))
                stack.extend(reversed(children.get(row.id, [])))
            return ordered
        return self._read(fn)

    # ------------------------------------------------------------------ compatibility

    def record_compatibility(
        self,
        rows: Iterable[Sequence[Any] | Mapping[str, Any]],
        *,
        step: Optional[str] = None,
        step_outputs: Optional[Mapping[str, Any]] = None,
    ) -> int:
        """Upsert compatibility values. Each row is ``(query, gallery, metric, value, dataset)``
        or a mapping with those keys; NaN/None values are stored as NULL (no common distance).
        All rows in one transaction (plus the commit of ``step``, if given). Returns the number
        of distinct (query, gallery, metric, dataset) keys written."""
        wanted = self._compatibility_keys(rows)

        def fn(session: Session) -> int:
            self._upsert_compatibility_in(session, wanted)
            if step is not None:
                self._commit_step_in(session, step, step_outputs if step_outputs is not None else {"values": len(wanted)})
            session.flush()
            return len(wanted)
        return self._write(fn)

    @staticmethod
    def _compatibility_keys(rows: Iterable[Sequence[Any] | Mapping[str, Any]]) -> dict[tuple[str, str, str, str], Optional[float]]:
        wanted: dict[tuple[str, str, str, str], Optional[float]] = {}
        for row in rows:
            if isinstance(row, Mapping):
                query, gallery, metric, value, dataset = (row[k] for k in ("query", "gallery", "metric", "value", "dataset"))
            else:
                query, gallery, metric, value, dataset = row
            wanted[(str(query), str(gallery), str(metric), str(dataset))] = _float_or_none(value)
        return wanted

    def _upsert_compatibility_in(self, session: Session, wanted: Mapping[tuple[str, str, str, str], Optional[float]]) -> None:
        gens = self._generations_by_name(session, {k[0] for k in wanted} | {k[1] for k in wanted})
        existing: dict[tuple[int, int, str, str], Compatibility] = {}
        if wanted:
            stmt = select(Compatibility).where(
                Compatibility.query_generation_id.in_({gens[k[0]].id for k in wanted}),
                Compatibility.dataset.in_({k[3] for k in wanted}),
            ).with_for_update()
            for c in session.scalars(stmt):
                existing[(c.query_generation_id, c.gallery_generation_id, c.metric, c.dataset)] = c
        now = utcnow()
        for (query, gallery, metric, dataset), value in wanted.items():
            key = (gens[query].id, gens[gallery].id, metric, dataset)
            row = existing.get(key)
            if row is None:
                session.add(Compatibility(query_generation_id=key[0], gallery_generation_id=key[1],
                                          metric=metric, value=value, dataset=dataset, updated_at=now))
            elif _assign(row, value=value):
                row.updated_at = now

    def compatibility_values(self, dataset: Optional[str] = None) -> list[CompatibilityRecord]:
        """Recorded values (all datasets, or one), ordered by query, gallery, dataset, metric."""
        def fn(session: Session) -> list[CompatibilityRecord]:
            stmt = select(Compatibility).order_by(
                Compatibility.query_generation_id, Compatibility.gallery_generation_id,
                Compatibility.dataset, Compatibility.metric,
            )
            if dataset is not None:
                stmt = stmt.where(Compatibility.dataset == dataset)
            names = self._names(session)
            return [CompatibilityRecord(names[c.query_generation_id], names[c.gallery_generation_id],
                                        c.metric, c.value, c.dataset) for c in session.scalars(stmt)]
        return self._read(fn)

    # ------------------------------------------------------------------ galleries and shards

    def upsert_gallery(self, name: str, source_uri: Optional[str] = None, n_items: Optional[int] = None,
                       n_shards: int = 1) -> GalleryRecord:
        """Create or update gallery ``name``, and one (empty) shard row per index < ``n_shards``
        so every shard shows up before it holds embeddings. Lowering ``n_shards`` below an
        existing shard index raises ValueError (re-shard under a new gallery name)."""
        if n_shards < 1:
            raise ValueError(f"gallery {name!r}: n_shards must be ≥ 1, got {n_shards}")

        def fn(session: Session) -> GalleryRecord:
            row = session.scalars(select(Gallery).where(Gallery.name == name).with_for_update()).one_or_none()
            if row is None:
                row = Gallery(name=name, source_uri=source_uri, n_items=n_items, n_shards=n_shards, created_at=utcnow())
                session.add(row)
                session.flush()
                present: set[int] = set()
            else:
                present = set(session.scalars(select(Shard.index).where(Shard.gallery_id == row.id)))
                if present and max(present) >= n_shards:
                    raise ValueError(f"gallery {name!r} already has shard {max(present)}; cannot shrink to {n_shards} shards")
                _assign(row, source_uri=source_uri, n_items=n_items, n_shards=n_shards)
            now = utcnow()
            for index in range(n_shards):
                if index not in present:
                    session.add(Shard(gallery_id=row.id, index=index, updated_at=now))
            session.flush()
            return self._gallery_record(row)
        return self._write(fn)

    def galleries(self) -> list[GalleryRecord]:
        return self._read(lambda s: [self._gallery_record(g) for g in s.scalars(select(Gallery).order_by(Gallery.id))])

    def get_gallery(self, name: str) -> GalleryRecord:
        return self._read(lambda s: self._gallery_record(self._gallery(s, name)))

    def _shard(self, session: Session, gallery: Gallery, index: int) -> Shard:
        if not 0 <= index < gallery.n_shards:
            raise ValueError(f"gallery {gallery.name!r} has shards 0..{gallery.n_shards - 1}, not {index}")
        row = session.scalars(
            select(Shard).where(Shard.gallery_id == gallery.id, Shard.index == index).with_for_update()
        ).one_or_none()
        if row is None:
            row = Shard(gallery_id=gallery.id, index=index, updated_at=utcnow())
            session.add(row)
            session.flush()
        return row

    def assign_shard(
        self,
        gallery: str,
        index: int,
        generation: str,
        embeddings_uri: Optional[str] = None,
        index_uri: Optional[str] = None,
        sha256: Optional[str] = None,
        n_items: Optional[int] = None,
        *,
        step: Optional[str] = None,
        step_outputs: Optional[Mapping[str, Any]] = None,
    ) -> ShardRecord:
        """Point shard ``index`` of ``gallery`` at ``generation``'s embeddings and index (files
        already written). In the same transaction: if the shard changes generation, a
        ``committed`` backfill row from → to (completing one opened by ``start_backfill``);
        with ``step``, the step's commit. Re-assigning the generation a shard already holds
        only updates its URIs/sha256/size — no backfill row, so a re-run adds nothing."""
        assignment = ShardAssignment(index, generation, embeddings_uri, index_uri, sha256, n_items)
        outputs = step_outputs if step_outputs is not None else {
            "gallery": gallery, "shard": index, "generation": generation,
            "embeddings_uri": embeddings_uri, "index_uri": index_uri, "sha256": sha256,
        }
        return self.assign_shards(gallery, [assignment], step=step, step_outputs=outputs)[0]

    def assign_shards(
        self,
        gallery: str,
        assignments: Iterable[ShardAssignment],
        *,
        grow: bool = False,
        step: Optional[str] = None,
        step_outputs: Optional[Mapping[str, Any]] = None,
    ) -> list[ShardRecord]:
        """Apply several shard assignments of ``gallery`` in ONE transaction (see ``assign_shard``
        for one): e.g. moving backfilled items out of a shard into a new one, so no reader ever
        sees the items in both shards or in neither. With ``grow``, a shard index at or beyond the
        gallery's shard count adds that shard (the gallery grows); without, it is an error. With ``step``, the step commits in the
        same transaction."""
        assignments = list(assignments)
        if not assignments:
            raise ValueError(f"gallery {gallery!r}: no shard assignments given")
        if len({a.index for a in assignments}) != len(assignments):
            raise ValueError(f"gallery {gallery!r}: a shard index appears twice in one assignment")

        def fn(session: Session) -> list[ShardRecord]:
            gallery_row = self._gallery(session, gallery)
            highest = max(a.index for a in assignments)
            if grow and highest >= gallery_row.n_shards:
                gallery_row.n_shards = highest + 1
            records = [self._assign_in(session, gallery_row, a) for a in assignments]
            if step is not None:
                self._commit_step_in(session, step, step_outputs if step_outputs is not None else {
                    "gallery": gallery, "shards": [a.index for a in assignments]})
            session.flush()
            return records
        return self._write(fn)

    def _assign_in(self, session: Session, gallery_row: Gallery, assignment: ShardAssignment) -> ShardRecord:
        gen = self._generation(session, assignment.generation)
        shard = self._shard(session, gallery_row, assignment.index)
        now = utcnow()
        if shard.generation_id != gen.id:
            source_id = (shard.generation_id if assignment.backfilled_from is None
                         else self._generation(session, assignment.backfilled_from).id)
            open_backfill = session.scalars(
                select(Backfill).where(Backfill.shard_id == shard.id, Backfill.to_generation_id == gen.id,
                                       Backfill.status == "started").order_by(Backfill.id.desc()).with_for_update()
            ).first()
            if open_backfill is None:
                session.add(Backfill(shard_id=shard.id, from_generation_id=source_id, to_generation_id=gen.id,
                                     items=assignment.n_items, status="committed", started_at=now, finished_at=now))
            else:
                open_backfill.from_generation_id = source_id
                open_backfill.items = assignment.n_items if assignment.n_items is not None else open_backfill.items
                open_backfill.status = "committed"
                open_backfill.finished_at = now
        if _assign(shard, generation_id=gen.id, embeddings_uri=assignment.embeddings_uri,
                   index_uri=assignment.index_uri, sha256=assignment.sha256, n_items=assignment.n_items):
            shard.updated_at = now
        session.flush()
        return self._shard_record(shard, gallery_row.name, self._names(session))

    def start_backfill(self, gallery: str, index: int, generation: str, items: Optional[int] = None) -> Optional[BackfillRecord]:
        """Open a ``started`` backfill of a shard towards ``generation`` (for progress/audit;
        ``assign_shard`` commits it). Idempotent: an open one is returned as is. None when the
        shard already holds ``generation`` (nothing to backfill)."""
        def fn(session: Session) -> Optional[BackfillRecord]:
            gallery_row = self._gallery(session, gallery)
            gen = self._generation(session, generation)
            shard = self._shard(session, gallery_row, index)
            if shard.generation_id == gen.id:
                return None
            row = session.scalars(
                select(Backfill).where(Backfill.shard_id == shard.id, Backfill.to_generation_id == gen.id,
                                       Backfill.status == "started").order_by(Backfill.id.desc())
            ).first()
            if row is None:
                row = Backfill(shard_id=shard.id, from_generation_id=shard.generation_id, to_generation_id=gen.id,
                               items=items, status="started", started_at=utcnow())
                session.add(row)
                session.flush()
            return self._backfill_record(row, gallery_row.name, shard.index, self._names(session))
        return self._write(fn)

    def fail_backfill(self, gallery: str, index: int, generation: str) -> Optional[BackfillRecord]:
        """Mark the open backfill of a shard towards ``generation`` failed (None if none is open);
        the shard keeps its current generation."""
        def fn(session: Session) -> Optional[BackfillRecord]:
            gallery_row = self._gallery(session, gallery)
            gen = self._generation(session, generation)
            shard = self._shard(session, gallery_row, index)
            row = session.scalars(
                select(Backfill).where(Backfill.shard_id == shard.id, Backfill.to_generation_id == gen.id,
                                       Backfill.status == "started").order_by(Backfill.id.desc()).with_for_update()
            ).first()
            if row is None:
                return None
            row.status, row.finished_at = "failed", utcnow()
            session.flush()
            return self._backfill_record(row, gallery_row.name, shard.index, self._names(session))
        return self._write(fn)

    def backfills(self, gallery: Optional[str] = None) -> list[BackfillRecord]:
        """Backfill history (oldest first), of one gallery or all."""
        def fn(session: Session) -> list[BackfillRecord]:
            stmt = (select(Backfill, Gallery.name, Shard.index).join(Shard, Backfill.shard_id == Shard.id)
                    .join(Gallery, Shard.gallery_id == Gallery.id).order_by(Backfill.id))
            if gallery is not None:
                stmt = stmt.where(Gallery.id == self._gallery(session, gallery).id)
            names = self._names(session)
            return [self._backfill_record(b, g, i, names) for b, g, i in session.execute(stmt)]
        return self._read(fn)

    def shards(self, gallery: str) -> list[ShardRecord]:
        """The shards of ``gallery`` by index, each with the generation it holds (None: empty)."""
        def fn(session: Session) -> list[ShardRecord]:
            gallery_row = self._gallery(session, gallery)
            names = self._names(session)
            rows = session.scalars(select(Shard).where(Shard.gallery_id == gallery_row.id).order_by(Shard.index))
            return [self._shard_record(r, gallery_row.name, names) for r in rows]
        return self._read(fn)

    # ------------------------------------------------------------------ sweep candidates

    def record_candidate(
        self,
        name: str,
        *,
        sweep: str,
        trial_id: str,
        parent: str,
        method: str,
        params: Mapping[str, Any],
        outcome: str,
        epochs: int,
        objective: Optional[float] = None,
        metrics: Optional[Mapping[str, Any]] = None,
        arch: Optional[str] = None,
        space: Optional[str] = None,
        curv: Optional[float] = None,
        checkpoint_uri: Optional[str] = None,
        sha256: Optional[str] = None,
        compatibility: Iterable[Sequence[Any] | Mapping[str, Any]] = (),
    ) -> CandidateRecord:
        """Record one sweep trial as a candidate generation ``name`` (child of ``parent``), in ONE
        transaction: the generation row (status ``failed`` for an errored trial, else ``trained``;
        the checkpoint when the trial wrote one; ``metrics`` replace the recorded ones), its
        candidate row (``outcome`` finished|stopped|error, epochs run, objective) and its
        compatibility values (rows as for ``record_compatibility``). Recording the same trial again
        updates it. A name held by a generation that is not this trial's candidate is a ValueError."""
        if outcome not in CANDIDATE_OUTCOMES:
            raise ValueError(f"candidate outcome must be one of {CANDIDATE_OUTCOMES}, got {outcome!r}")
        wanted = self._compatibility_keys(compatibility)
        fields = {
            "method": method, "params": clean_json(dict(params)), "arch": arch, "space": space,
            "curv": None if curv is None else float(curv), "checkpoint_uri": checkpoint_uri, "sha256": sha256,
            "status": "failed" if outcome == "error" else "trained", "metrics": clean_json(dict(metrics or {})),
        }

        def fn(session: Session) -> CandidateRecord:
            parent_row = self._generation(session, parent)
            now = utcnow()
            row = session.scalars(select(Generation).where(Generation.name == name).with_for_update()).one_or_none()
            candidate = None
            if row is not None:
                candidate = session.scalars(select(Candidate).where(Candidate.generation_id == row.id)).one_or_none()
                if candidate is None or (candidate.sweep, candidate.trial_id) != (sweep, trial_id):
                    raise ValueError(f"generation name {name!r} is taken by another generation; a sweep candidate "
                                     "needs a name of its own")
            if row is None:
                row = Generation(name=name, parent_id=parent_row.id, created_at=now, updated_at=now, **fields)
                session.add(row)
                session.flush()
            elif _assign(row, parent_id=parent_row.id, **fields):
                row.updated_at = now
            values = {"outcome": outcome, "epochs": int(epochs), "objective": _float_or_none(objective)}
            if candidate is None:
                candidate = Candidate(generation_id=row.id, sweep=sweep, trial_id=trial_id, created_at=now,
                                      updated_at=now, **values)
                session.add(candidate)
            elif _assign(candidate, **values):
                candidate.updated_at = now
            self._upsert_compatibility_in(session, wanted)
            session.flush()
            return self._candidate_record(candidate, row.name, parent_row.name)
        return self._write(fn)

    def candidates(self, sweep: Optional[str] = None) -> list[CandidateRecord]:
        """Sweep candidates in recording order, of one sweep or all."""
        def fn(session: Session) -> list[CandidateRecord]:
            stmt = (select(Candidate, Generation).join(Generation, Candidate.generation_id == Generation.id)
                    .order_by(Candidate.id))
            if sweep is not None:
                stmt = stmt.where(Candidate.sweep == sweep)
            names = self._names(session)
            return [self._candidate_record(c, g.name, names.get(g.parent_id) if g.parent_id else None)
                    for c, g in session.execute(stmt)]
        return self._read(fn)

    @staticmethod
    def _candidate_record(row: Candidate, name: str, parent: Optional[str]) -> CandidateRecord:
        return CandidateRecord(name=name, parent=parent, sweep=row.sweep, trial_id=row.trial_id, outcome=row.outcome,
                               epochs=row.epochs, objective=row.objective, created_at=_aware(row.created_at),
                               updated_at=_aware(row.updated_at))

    # ------------------------------------------------------------------ deployments

    def deploy(self, generation: str, *, step: Optional[str] = None,
               step_outputs: Optional[Mapping[str, Any]] = None,
               restore: Optional[tuple[str, Sequence[ShardAssignment]]] = None) -> DeploymentRecord:
        """Make ``generation`` (status ``trained``) the one serving queries. Deploying the
        generation that already serves changes nothing. ``restore`` = (gallery, assignments): the
        shards it serves with, applied in the same transaction (a rollback to an earlier
        deployment's shards; every assigned index must exist)."""
        def fn(session: Session) -> DeploymentRecord:
            if restore is not None:
                gallery_row = self._gallery(session, restore[0])
                for assignment in restore[1]:
                    if assignment.index >= gallery_row.n_shards:
                        raise ValueError(f"gallery {restore[0]!r} has no shard {assignment.index}")
                    self._assign_in(session, gallery_row, assignment)
            gen = self._generation(session, generation)
            if gen.status != "trained":
                raise ValueError(f"generation {generation!r} is {gen.status}, only a trained generation can be deployed")
            candidate = session.scalars(select(Candidate).where(Candidate.generation_id == gen.id)).one_or_none()
            if candidate is not None:
                raise ValueError(f"generation {generation!r} is a candidate of sweep {candidate.sweep!r}, never deployed: "
                                 "put its generation block in the pipeline and run the pipeline")
            current = session.scalars(select(Deployment).order_by(Deployment.id.desc()).with_for_update()).first()
            if current is None or current.generation_id != gen.id:
                current = Deployment(generation_id=gen.id, started_at=utcnow())
                session.add(current)
                session.flush()
            if step is not None:
                self._commit_step_in(session, step, step_outputs if step_outputs is not None else {"generation": generation})
            return DeploymentRecord(current.id, gen.name, _aware(current.started_at))
        return self._write(fn)

    def current_deployment(self) -> Optional[DeploymentRecord]:
        """The newest deployment (the generation serving now), or None."""
        deployments = self._read(lambda s: self._deployments(s, newest_only=True))
        return deployments[0] if deployments else None

    def deployments(self) -> list[DeploymentRecord]:
        """Deployment history, oldest first."""
        return self._read(lambda s: self._deployments(s, newest_only=False))

    def _deployments(self, session: Session, newest_only: bool) -> list[DeploymentRecord]:
        stmt = select(Deployment, Generation.name).join(Generation, Deployment.generation_id == Generation.id)
        stmt = stmt.order_by(Deployment.id.desc()).limit(1) if newest_only else stmt.order_by(Deployment.id)
        return [DeploymentRecord(d.id, name, _aware(d.started_at)) for d, name in session.execute(stmt)]

    # ------------------------------------------------------------------ maintenance

    def row_counts(self) -> dict[str, int]:
        """Rows per table (tests and ``orchestrator lineage --json`` diagnostics)."""
        from sqlalchemy import func

        def fn(session: Session) -> dict[str, int]:
            return {t.name: int(session.scalar(select(func.count()).select_from(t)) or 0)
                    for t in Base.metadata.sorted_tables}
        return self._read(fn)
