"""A lineage database that cannot be used is told where it fails, by the store's engine
(``lineage.sessions.unusable``): one ``OutsideSystemError`` line naming the database (password
hidden) and what to check; a constraint's or a statement's error stays as SQLAlchemy raised it."""
from __future__ import annotations

import pickle
import re
import socket
import sqlite3

import pytest
from sqlalchemy.exc import DatabaseError, IntegrityError, OperationalError, ProgrammingError

from orchestrator.errors import ExitCode, OutsideSystemError
from orchestrator.lineage import LineageStore
from orchestrator.lineage.sessions import unusable


def test_a_file_that_is_not_a_database_is_one_line_naming_it(tmp_path):
    database = tmp_path / "garbled.db"
    database.write_bytes(b"not a database at all\n" * 64)
    with pytest.raises(OutsideSystemError) as caught:
        LineageStore(database)
    assert re.fullmatch(re.escape(f"SQLite at sqlite:///{database}: file is not a database; check that the file is a "
                                  "lineage database you may read and write, and its folder exists and is writable"),
                        str(caught.value))
    assert caught.value.exit_code == ExitCode.UNREACHABLE and caught.value.system == "SQLite"
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)  # the driver's error, chained for -v
    copied = pickle.loads(pickle.dumps(caught.value))  # it crosses from a Ray worker to the driver
    assert type(copied) is OutsideSystemError and str(copied) == str(caught.value)
    assert (copied.system, copied.location) == ("SQLite", f"sqlite:///{database}")


def test_a_postgresql_server_that_refuses_is_one_line_without_the_password():
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(OutsideSystemError) as caught:
        LineageStore(f"postgresql://ann:hunter2@127.0.0.1:{port}/lineage")
    message = str(caught.value)
    assert message.startswith(f"PostgreSQL at postgresql+psycopg://ann:***@127.0.0.1:{port}/lineage: ")
    assert message.endswith("; check that the server runs and accepts this user (PGPASSWORD or ~/.pgpass; never a "
                            "password in the URL) and the database exists")
    assert "hunter2" not in message and "\n" not in message


def test_only_errors_of_an_unusable_database_are_translated():
    cause = Exception("boom\n  second line")
    assert unusable("sqlite:///l.db", IntegrityError("INSERT", {}, cause)) is None  # a constraint: the caller's
    assert unusable("sqlite:///l.db", ProgrammingError("SELECT", {}, cause)) is None  # a statement: a bug
    for kind in (OperationalError, DatabaseError):
        translated = unusable("postgresql+psycopg://u:***@h/db", kind("SELECT 1", {}, cause))
        assert str(translated) == ("PostgreSQL at postgresql+psycopg://u:***@h/db: boom second line; check that the "
                                   "server runs and accepts this user (PGPASSWORD or ~/.pgpass; never a password in the "
                                   "URL) and the database exists")
