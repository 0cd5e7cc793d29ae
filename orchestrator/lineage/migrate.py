"""Schema migrations of the lineage store (Alembic revisions in ``migrations/versions``).

``upgrade(engine)`` brings a store to the newest revision (``HEAD``) in one write transaction:
a new database gets every table, a store created by ``create_all`` before migrations existed (no
version table) is adopted by the initial revision, an older revision is upgraded. Concurrent
openers are serialised (SQLite: the transaction's BEGIN IMMEDIATE; PostgreSQL: a transaction-level
advisory lock), so two writers opening a new store at once migrate it once. ``state`` tells
readers what is there without changing anything.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Optional

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, func, inspect, select

VERSION_TABLE = "lineage_schema_version"
MIGRATIONS = Path(__file__).with_name("migrations")
LEGACY = "legacy"  # lineage tables but no version table: made by create_all before migrations existed
# The advisory lock every PostgreSQL migrator takes (any 64-bit number; derived, not hand-picked).
_MIGRATION_LOCK = int.from_bytes(hashlib.sha256(b"orchestrator lineage migration").digest()[:8], "big", signed=True)


def _config(connection: Optional[Connection] = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("version_table", VERSION_TABLE)
    config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def head() -> str:
    """The newest revision of the schema."""
    return ScriptDirectory.from_config(_config()).get_current_head()


def state(connection: Connection) -> Optional[str]:
    """The store's revision, ``LEGACY``, or None when the database holds no lineage (neither a
    version table nor a generations table). Reads only."""
    tables = set(inspect(connection).get_table_names())
    if VERSION_TABLE in tables:
        return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()
    return LEGACY if "generations" in tables else None


def upgrade(engine: Engine, write_engine: Engine) -> None:
    """Bring the store to ``head()``; reads first, so a current store takes no write lock."""
    with engine.connect() as connection:
        if state(connection) == head():
            return
    with write_engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(select(func.pg_advisory_xact_lock(_MIGRATION_LOCK)))
        if state(connection) != head():  # another opener may have migrated it while we waited
            command.upgrade(_config(connection), "head")
