"""Sweep trials in the lineage: candidate generations recorded in one transaction, idempotently,
never deployed, shown under their parent; a store created before sweeps existed gains the table."""
from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import create_engine

from orchestrator.lineage import LineageStore, lineage_json, lineage_tree_text
from orchestrator.lineage.schema import Base


def candidate(store: LineageStore, trial: str, outcome: str = "finished", epochs: int = 3, **fields):
    name = f"sweep/{trial}"
    values = {"self": 0.8, "cross": 0.6}
    return store.record_candidate(
        name, sweep="sweep", trial_id=trial, parent="g0", method="hbct", params={"lam": 0.3}, outcome=outcome,
        epochs=epochs, objective=0.6, metrics={"cross_map": 0.6}, arch="test_resnet",
        checkpoint_uri=f"/x/{trial}" if outcome == "finished" else None,
        compatibility=[(name, name, "map", values["self"], "test"), (name, "g0", "map", values["cross"], "test")],
        **fields)


@pytest.fixture
def store(tmp_path):
    s = LineageStore(f"sqlite:///{tmp_path}/lineage.db")
    s.upsert_generation("g0", method="hbct", arch="test_resnet")
    s.mark_generation_trained("g0", "/x/g0", "a" * 64)
    return s


def test_a_candidate_is_a_generation_with_its_values_and_is_never_deployed(store):
    record = candidate(store, "t1")
    assert (record.name, record.parent, record.outcome, record.epochs, record.objective) == ("sweep/t1", "g0", "finished", 3, 0.6)
    generation = store.get_generation("sweep/t1")
    assert generation.status == "trained" and generation.parent == "g0" and generation.checkpoint_uri == "/x/t1"
    values = {(c.query, c.gallery, c.metric): c.value for c in store.compatibility_values("test")}
    assert values == {("sweep/t1", "sweep/t1", "map"): 0.8, ("sweep/t1", "g0", "map"): 0.6}
    with pytest.raises(ValueError, match="candidate of sweep 'sweep', never deployed"):
        store.deploy("sweep/t1")
    assert store.current_deployment() is None
    store.deploy("g0")  # an ordinary trained generation still deploys
    assert store.current_deployment().generation == "g0"


def test_recording_again_updates_in_place(store):
    candidate(store, "t1", outcome="stopped", epochs=1)
    candidate(store, "t1", outcome="finished", epochs=3)
    counts = store.row_counts()
    assert counts["candidates"] == 1 and counts["generations"] == 2 and counts["compatibility"] == 2
    assert [(c.outcome, c.epochs) for c in store.candidates("sweep")] == [("finished", 3)]
    errored = candidate(store, "t2", outcome="error", epochs=0)
    assert errored.outcome == "error" and store.get_generation("sweep/t2").status == "failed"
    assert [c.trial_id for c in store.candidates()] == ["t1", "t2"] and store.candidates("other") == []


def test_names_and_outcomes_are_checked(store):
    with pytest.raises(ValueError, match="taken by another generation"):
        store.record_candidate("g0", sweep="sweep", trial_id="t9", parent="g0", method="hbct", params={},
                               outcome="finished", epochs=1)
    with pytest.raises(ValueError, match="outcome must be one of"):
        candidate(store, "t1", outcome="done")
    with pytest.raises(LookupError, match="g7"):
        store.record_candidate("sweep/t1", sweep="sweep", trial_id="t1", parent="g7", method="hbct", params={},
                               outcome="finished", epochs=1)
    assert store.row_counts()["candidates"] == 0  # nothing half-written


def test_candidates_show_under_their_parent(store):
    candidate(store, "t1")
    candidate(store, "t2", outcome="stopped", epochs=1)
    text = lineage_tree_text(store)
    assert "├─ sweep/t1  hbct  candidate finished @3 ep  self mAP 0.800 | cross→g0 mAP 0.600" in text
    assert "└─ sweep/t2  hbct  candidate stopped @1 ep" in text
    assert [c["trial_id"] for c in lineage_json(store)["candidates"]] == ["t1", "t2"]


def test_a_store_created_before_sweeps_gains_the_candidates_table(tmp_path):
    path = tmp_path / "old.db"
    engine = create_engine(f"sqlite:///{path}")
    Base.metadata.create_all(engine, tables=[t for t in Base.metadata.sorted_tables  # as before sweeps, run locks and settings
                                          if t.name not in ("candidates", "run_locks", "settings")])
    engine.dispose()
    with sqlite3.connect(path) as connection:
        connection.execute("insert into generations (name, status, params, metrics, created_at, updated_at) "
                           "values ('g0', 'trained', '{}', '{}', '2026-01-01', '2026-01-01')")
        tables = {r[0] for r in connection.execute("select name from sqlite_master where type = 'table'")}
    assert "candidates" not in tables and "generations" in tables
    store = LineageStore(f"sqlite:///{path}")
    candidate(store, "t1")
    assert [c.name for c in store.candidates()] == ["sweep/t1"] and store.get_generation("g0").status == "trained"
