"""The lineage schema is portable: it compiles for PostgreSQL and uses only portable types."""
from __future__ import annotations

import pytest
from sqlalchemy import JSON, DateTime, Float, Integer, String, Text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.schema import CreateIndex, CreateTable

from orchestrator.lineage.schema import Base

EXPECTED_TABLES = {"pipeline_runs", "generations", "galleries", "shards", "backfills", "compatibility",
                   "deployments", "steps", "candidates", "run_locks", "settings"}


def test_all_tables_are_defined():
    assert set(Base.metadata.tables) == EXPECTED_TABLES


@pytest.mark.parametrize("dialect", [postgresql.dialect(), sqlite.dialect()], ids=["postgresql", "sqlite"])
def test_every_table_compiles(dialect):
    for table in Base.metadata.sorted_tables:
        ddl = str(CreateTable(table).compile(dialect=dialect))
        assert f"CREATE TABLE {table.name}" in ddl
        for index in table.indexes:
            str(CreateIndex(index).compile(dialect=dialect))


def test_postgresql_ddl_has_the_idempotency_constraints():
    ddl = {t.name: str(CreateTable(t).compile(dialect=postgresql.dialect())) for t in Base.metadata.sorted_tables}
    assert "UNIQUE (name)" in ddl["generations"] and "UNIQUE (name)" in ddl["galleries"]
    assert "UNIQUE (gallery_id, index)" in ddl["shards"]
    assert "UNIQUE (query_generation_id, gallery_generation_id, metric, dataset)" in ddl["compatibility"]
    assert "UNIQUE (key)" in ddl["steps"]
    assert "TIMESTAMP WITH TIME ZONE" in ddl["generations"] and "JSON" in ddl["generations"]
    assert "FOREIGN KEY(parent_id) REFERENCES generations (id)" in ddl["generations"]


def test_only_portable_column_types():
    portable = (Integer, String, Text, Float, DateTime, JSON)
    for table in Base.metadata.sorted_tables:
        for column in table.columns:
            assert type(column.type) in portable, f"{table.name}.{column.name}: {type(column.type).__name__}"
            if isinstance(column.type, DateTime):
                assert column.type.timezone, f"{table.name}.{column.name} must be timezone-aware"
