"""The lineage store's database connection: URLs, engines (SQLite's pragmas and BEGIN, PostgreSQL's
read-only sessions) and the read and write transactions every part of the store runs in (the
module docstring of ``store.py``: backends, idempotency). A database that cannot be used (it does
not answer, refuses the user, is locked, or is not a database) raises ``OutsideSystemError`` from
the engine itself, naming the database (password hidden) and what to check."""
from __future__ import annotations

import os
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DatabaseError, DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from orchestrator.errors import OutsideSystemError, one_line
from orchestrator.lineage.errors import LineageNotFound

T = TypeVar("T")

WRITE_OPTION = "lineage_write"
_WRITE_RETRIES = 2  # one retry after an insert race (IntegrityError) on backends without a table lock
# SQLAlchemy's own default driver, psycopg2, is not installed; "postgres" is an alias SQLAlchemy 2 dropped.
_DEFAULT_DRIVERS = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg"}


def normalise_url(url: str | os.PathLike) -> URL:
    """A SQLAlchemy URL, or a filesystem path → ``sqlite:///<absolute path>``; ``postgresql://``
    → ``postgresql+psycopg://``."""
    if not isinstance(url, URL):
        text = os.fspath(url)
        if "://" not in text:
            return URL.create("sqlite", database=str(Path(text).expanduser().resolve()))
        url = make_url(text)
    return url.set(drivername=_DEFAULT_DRIVERS.get(url.drivername, url.drivername))


def sqlite_in_memory(url: URL) -> bool:
    """True for an in-memory SQLite URL."""
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database


def _readonly_sqlite(url: URL, follows_writers: bool = False) -> URL:
    """The URL of an existing SQLite file opened read-only; LineageNotFound when there is none:
    checked before connecting, since connecting would create the file.

    Read-only creates nothing: a WAL database opened ``mode=ro`` would still create its ``-wal``
    and ``-shm`` files next to it (and leave them). When no ``-wal`` file exists no writer has the
    database open, and every committed row is in the file itself, so it is opened ``immutable``
    (no WAL index, no lock files); while a writer has it open (its ``-wal`` exists) the reader
    shares that writer's WAL index (``mode=ro``), so it sees what the writer committed. A reader that
    ``follows_writers`` (a server reading a lineage that runs write to for as long as it runs) is
    always opened ``mode=ro``: an immutable connection would never see a later commit."""
    path = Path(url.database or "").expanduser()
    if sqlite_in_memory(url) or not path.is_file():
        where = url.render_as_string(hide_password=True)
        reason = "a folder, not a database file" if path.is_dir() else "no such file"
        raise LineageNotFound(f"no lineage store at {where} ({reason})")
    resolved = path.resolve()
    mode = "mode=ro" if follows_writers or Path(f"{resolved}-wal").exists() else "mode=ro&immutable=1"
    return url.set(database=f"file:{urllib.parse.quote(str(resolved))}?{mode}", query={"uri": "true"})


def make_engine(url: URL, busy_timeout_s: float, echo: bool, readonly: bool, follows_writers: bool = False) -> Engine:
    """The engine for ``url``: SQLite with its pragmas and our own BEGIN, or PostgreSQL (read-only sessions
    when ``readonly``); its unusable-database errors raised as ``OutsideSystemError`` (``unusable``)."""
    location = url.render_as_string(hide_password=True)
    if not url.get_backend_name() == "sqlite":
        connect_args = {"options": "-c default_transaction_read_only=on"} if readonly else {}
        engine = create_engine(url, echo=echo, pool_pre_ping=True, connect_args=connect_args)
        event.listen(engine, "handle_error", lambda context: unusable(location, context.sqlalchemy_exception))
        return engine

    in_memory = sqlite_in_memory(url)
    kwargs: dict[str, Any] = {"echo": echo, "connect_args": {"timeout": busy_timeout_s}}
    if readonly:
        url = _readonly_sqlite(url, follows_writers)
    elif in_memory:
        # One shared connection, or every pooled connection would see its own empty database.
        kwargs["poolclass"] = StaticPool
        kwargs["connect_args"]["check_same_thread"] = False
    elif url.database and not url.database.startswith("file:"):
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, **kwargs)
    event.listen(engine, "handle_error", lambda context: unusable(location, context.sqlalchemy_exception))

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
        write = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def unusable(location: str, error: BaseException) -> OutsideSystemError | None:
    """The lineage database at ``location`` (password hidden) as ``OutsideSystemError`` when
    ``error`` says it cannot be used: it does not answer, refuses, is locked or is not a database
    (SQLAlchemy's ``OperationalError``, ``InterfaceError`` or a plain ``DatabaseError``); None for a
    constraint's or a statement's error (an ``IntegrityError``, a ``ProgrammingError``), which stays
    as it is. The engine's ``handle_error`` event raises what this returns in place of ``error``."""
    if not (isinstance(error, (OperationalError, InterfaceError)) or type(error) is DatabaseError):
        return None
    cause = one_line(error.orig if isinstance(error, DBAPIError) and error.orig is not None else error)
    if location.startswith("sqlite"):
        return OutsideSystemError("SQLite", location, cause, "that the file is a lineage database you may read and "
                                  "write, and its folder exists and is writable")
    return OutsideSystemError("PostgreSQL", location, cause, "that the server runs and accepts this user "
                              "(PGPASSWORD or ~/.pgpass; never a password in the URL) and the database exists")


class StoreSessions:
    """Read and write transactions over the sessions ``LineageStore`` opens."""

    _read_sessions: sessionmaker[Session]
    _write_sessions: sessionmaker[Session]

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
