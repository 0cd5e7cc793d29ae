"""A read-only SQLite store creates nothing next to the database, and still sees what a writer
that has the database open commits (issue 27, finding 4: readers left ``-wal`` and ``-shm``)."""
from __future__ import annotations

from pathlib import Path

from orchestrator.lineage import LineageStore


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_a_reader_creates_nothing_and_a_writer_s_commits_are_seen(tmp_path):
    database = tmp_path / "lineage.db"
    with LineageStore(database) as writer:
        writer.upsert_generation("g0", method="l2")
    before = listing(tmp_path)
    assert set(before) == {"lineage.db"}  # the writer's WAL was checkpointed and removed when it closed

    with LineageStore(database, readonly=True) as reader:
        assert [g.name for g in reader.list_generations()] == ["g0"]
    assert listing(tmp_path) == before  # no -wal, no -shm, nothing rewritten

    writer = LineageStore(database)  # a writer holds the database open (its -wal exists) ...
    writer.upsert_generation("g1", method="l2")
    try:
        with LineageStore(database, readonly=True) as reader:  # ... and the reader shares its WAL index
            assert [g.name for g in reader.list_generations()] == ["g0", "g1"]
            writer.upsert_generation("g2", parent="g1", method="l2")
            assert [g.name for g in reader.list_generations()] == ["g0", "g1", "g2"]
    finally:
        writer.close()


def test_a_reader_that_follows_writers_sees_commits_of_a_writer_that_came_after_it(tmp_path):
    database = tmp_path / "lineage.db"
    with LineageStore(database) as writer:
        writer.upsert_generation("g0", method="l2")
    with LineageStore(database, readonly=True, follows_writers=True) as server:  # opened with no writer about
        assert [g.name for g in server.list_generations()] == ["g0"]
        with LineageStore(database) as writer:  # a run starts later, commits, and ends
            writer.upsert_generation("g1", method="l2")
        assert [g.name for g in server.list_generations()] == ["g0", "g1"]
