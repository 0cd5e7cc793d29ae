"""Run locks: one process at a time runs (or deploys, collects, tunes) a pipeline on a store.

The lock itself is released by the operating system or the database when its holder dies, so a
killed run never leaves a pipeline locked:

- PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock``) on a connection the holder
  keeps open; the key derives from the pipeline name.
- SQLite: ``flock`` on ``<database>.run-<pipeline>.lock`` beside the database file (the file stays;
  only the lock matters). An in-memory store (tests) locks within the process.

Taking it never waits for the lock: a second taker gets ``LineageBusy``, whose message names the
holder from the ``run_locks`` row the holder writes once it has the lock (user@host, pid, command,
since when). A holder that has the lock but has not written its row yet is given
``HOLDER_RECORD_WAIT_S`` to do so before the message says so.
Within one process the lock is reentrant per store, so a sweep holding it may run pipeline steps.
"""
from __future__ import annotations

import fcntl
import getpass
import hashlib
import os
import socket
import threading
import time
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional

from sqlalchemy import delete, func, select
from sqlalchemy.exc import SQLAlchemyError

from orchestrator.errors import OutsideSystemError
from orchestrator.lineage.errors import LineageBusy
from orchestrator.lineage.schema import RunLock, utcnow

if TYPE_CHECKING:
    from orchestrator.lineage.store import LineageStore

Release = Callable[[], None]
HOLDER_RECORD_WAIT_S = 5.0
_memory_held: set[tuple[int, str]] = set()
_memory_guard = threading.Lock()


def holder_description(purpose: str) -> str:
    """``"ann@node-1 (pid 4242, orchestrator run)"``: who takes a lock, for the busy message."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for the uid (containers)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()} (pid {os.getpid()}, {purpose})"


def advisory_key(pipeline: str) -> int:
    """The signed 64-bit PostgreSQL advisory lock key of ``pipeline``."""
    return int.from_bytes(hashlib.sha256(f"orchestrator run {pipeline}".encode()).digest()[:8], "big", signed=True)


def lock_file(database: str, pipeline: str) -> Path:
    """The file whose ``flock`` is the run lock of ``pipeline`` on the SQLite file ``database``."""
    path = Path(database).expanduser()
    return path.with_name(f"{path.name}.run-{pipeline}.lock")


class RunLocks:
    """The run locks of one store (``LineageStore.run_lock``); ``sqlite_file``: the store's SQLite
    database file (None for PostgreSQL and in-memory SQLite)."""

    def __init__(self, store: "LineageStore", sqlite_file: Optional[str]):
        self.store = store
        self.sqlite_file = sqlite_file
        self._depth: dict[str, int] = {}

    @contextmanager
    def hold(self, pipeline: str, purpose: str) -> Iterator[None]:
        if self._depth.get(pipeline):
            self._depth[pipeline] += 1
            try:
                yield
            finally:
                self._depth[pipeline] -= 1
            return
        release = self._acquire(pipeline)
        if release is None:
            raise LineageBusy(self._busy_message(pipeline))
        self._depth[pipeline] = 1
        try:
            self._record(pipeline, holder_description(purpose))
            yield
        finally:
            self._depth.pop(pipeline, None)
            try:
                with self.store.transaction() as session:
                    session.execute(delete(RunLock).where(RunLock.pipeline == pipeline))
            finally:
                release()

    def _acquire(self, pipeline: str) -> Optional[Release]:
        if self.store.url.get_backend_name() == "postgresql":
            return _advisory_lock(self.store, pipeline)
        if self.sqlite_file is not None:
            return _file_lock(lock_file(self.sqlite_file, pipeline))
        return _memory_lock((id(self.store.engine), pipeline))

    def _record(self, pipeline: str, holder: str) -> None:
        with self.store.transaction() as session:
            row = session.get(RunLock, pipeline)
            if row is None:
                session.add(RunLock(pipeline=pipeline, holder=holder, acquired_at=utcnow()))
            else:
                row.holder, row.acquired_at = holder, utcnow()

    def _holder_row(self, pipeline: str):
        with self.store.engine.connect() as connection:
            return connection.execute(select(RunLock.holder, RunLock.acquired_at)
                                      .where(RunLock.pipeline == pipeline)).first()

    def _busy_message(self, pipeline: str) -> str:
        deadline = time.monotonic() + HOLDER_RECORD_WAIT_S
        row = self._holder_row(pipeline)
        while row is None and time.monotonic() < deadline:  # the holder is between lock and record
            time.sleep(0.1)
            row = self._holder_row(pipeline)
        who = "another process (it has not recorded itself yet)" if row is None else \
            f"{row.holder} since {_utc(row.acquired_at):%Y-%m-%d %H:%M:%S} UTC"
        return (f"pipeline {pipeline!r} is held by {who} on lineage "
                f"{self.store.url.render_as_string(hide_password=True)}; wait for it to finish, then run again")


def _utc(value: datetime) -> datetime:
    """SQLite returns naive datetimes (written as UTC), PostgreSQL the session's zone."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _advisory_lock(store: "LineageStore", pipeline: str) -> Optional[Release]:
    connection = store.engine.connect()
    key = advisory_key(pipeline)
    try:
        taken = connection.execute(select(func.pg_try_advisory_lock(key))).scalar()
        connection.commit()  # a session lock outlives the transaction; don't sit idle in one
    except BaseException:
        connection.close()
        raise
    if not taken:
        connection.close()
        return None

    def release() -> None:
        # Unlock first: the server has released the lock when the call returns. Ending the session
        # alone releases it only once the server has seen the disconnect, which a next taker could
        # race (CI: a second store refused right after the first one's release, on 2 busy cores).
        try:
            with suppress(SQLAlchemyError, OutsideSystemError):  # a lost connection holds no lock
                connection.execute(select(func.pg_advisory_unlock(key)))
                connection.commit()
        finally:
            connection.invalidate()  # ends the database session, and any lock with it, whatever state it is in
            connection.close()
    return release


def _file_lock(path: Path) -> Optional[Release]:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+b")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None

    def release() -> None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        handle.close()
    return release


def _memory_lock(key: tuple[int, str]) -> Optional[Release]:
    with _memory_guard:
        if key in _memory_held:
            return None
        _memory_held.add(key)
    return lambda: _memory_held.discard(key)
