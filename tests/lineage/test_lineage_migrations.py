"""The lineage schema is made by the Alembic migrations, on SQLite and on a real PostgreSQL server:
a new store is migrated to exactly the models, a store made by ``create_all`` before migrations
existed is adopted with its rows, concurrent openers migrate once, and readers change nothing."""
from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.orm import Session

from orchestrator.lineage import LineageNotFound, LineageStore, migrate
from orchestrator.lineage.schema import Base, Generation, Step

VERSIONS = Path(migrate.__file__).with_name("migrations") / "versions"
PRE_MIGRATION_TABLES = [t for t in Base.metadata.sorted_tables if t.name not in ("run_locks", "settings")]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lineage.db'}"
    return request.getfixturevalue("postgres_url")


def newest_revision_file() -> str:
    return sorted(p.name for p in VERSIONS.glob("[0-9]*.py"))[-1].split("_", 1)[0]


def schema_differences(url: str) -> list:
    engine = create_engine(url)
    with engine.connect() as connection:
        differences = compare_metadata(
            MigrationContext.configure(connection, opts={"version_table": migrate.VERSION_TABLE}), Base.metadata)
    engine.dispose()
    return differences


def version_rows(url: str) -> list[tuple]:
    engine = create_engine(url)
    with engine.connect() as connection:
        rows = connection.execute(text(f"SELECT version_num FROM {migrate.VERSION_TABLE}")).all()
    engine.dispose()
    return [tuple(r) for r in rows]


def make_pre_migration_store(url: str) -> None:
    """A store as the code before migrations made it (create_all, no run_locks, no version), with rows."""
    engine = create_engine(url)
    Base.metadata.create_all(engine, tables=PRE_MIGRATION_TABLES)
    with Session(engine) as session, session.begin():
        session.add(Generation(name="g0", method="independent", params={"a": 1}, status="trained", metrics={}))
        session.add(Step(key="train:g0", status="committed", attempts=2, outputs={"sha256": "ab"}))
    engine.dispose()


def test_the_head_is_the_newest_revision_file():
    assert migrate.head() == newest_revision_file() == "0003"


def test_a_new_store_is_migrated_to_exactly_the_models(url):
    LineageStore(url).close()
    assert version_rows(url) == [(migrate.head(),)]
    assert schema_differences(url) == []


def test_the_migrations_make_the_same_sqlite_tables_as_create_all(tmp_path):
    def ddl(path: Path) -> dict[str, set[str]]:
        with sqlite3.connect(path) as connection:
            rows = connection.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
        return {name: {line.strip().rstrip(",") for line in sql.splitlines()} for name, sql in rows
                if name != migrate.VERSION_TABLE}

    engine = create_engine(f"sqlite:///{tmp_path / 'created.db'}")
    Base.metadata.create_all(engine)
    engine.dispose()
    LineageStore(tmp_path / "migrated.db").close()
    assert ddl(tmp_path / "migrated.db") == ddl(tmp_path / "created.db")


def test_a_store_made_before_migrations_upgrades_with_its_rows(url):
    make_pre_migration_store(url)
    store = LineageStore(url)
    assert version_rows(url) == [(migrate.head(),)]
    assert schema_differences(url) == []
    assert store.get_generation("g0").params == {"a": 1} and store.get_generation("g0").status == "trained"
    step = store.get_step("train:g0")
    assert (step.status, step.attempts, step.outputs) == ("committed", 2, {"sha256": "ab"})
    with store.run_lock("p", "test"):  # the table the upgrade added works
        assert store.row_counts()["run_locks"] == 1
    store.close()
    LineageStore(url).close()  # opening a current store again changes nothing
    assert version_rows(url) == [(migrate.head(),)]


def test_writers_opening_a_new_store_at_once_migrate_it_once(url):
    errors: list[BaseException] = []

    def open_store() -> None:
        try:
            LineageStore(url).close()
        except BaseException as error:  # collected for the assertion below
            errors.append(error)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert version_rows(url) == [(migrate.head(),)]
    assert schema_differences(url) == []


def test_a_reader_migrates_nothing_and_cannot_write(url):
    make_pre_migration_store(url)
    reader = LineageStore(url, readonly=True)
    assert reader.get_generation("g0").method == "independent"
    with pytest.raises(Exception, match="(?i)read.?only"):
        reader.upsert_generation("g1", method="bct", params={})
    reader.close()
    engine = create_engine(url)
    with engine.connect() as connection:
        assert migrate.VERSION_TABLE not in inspect(connection).get_table_names()
    engine.dispose()


def test_reading_a_missing_sqlite_store_creates_nothing(tmp_path):
    before = sorted(tmp_path.rglob("*"))
    for missing in (tmp_path / "runs" / "x" / "lineage.db", tmp_path / "lineage.db"):
        with pytest.raises(LineageNotFound, match="no such file"):
            LineageStore(f"sqlite:///{missing}", readonly=True)
    assert sorted(tmp_path.rglob("*")) == before


def test_reading_an_empty_postgresql_database_creates_no_table(postgres_url):
    with pytest.raises(LineageNotFound, match="no lineage tables"):
        LineageStore(postgres_url, readonly=True)
    engine = create_engine(postgres_url)
    with engine.connect() as connection:
        assert inspect(connection).get_table_names() == []
    engine.dispose()
