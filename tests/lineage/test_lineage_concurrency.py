"""Several processes on one SQLite lineage file: visibility, atomicity, SIGKILL mid-transaction,
and a killed driver that is run again."""
from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from orchestrator.errors import OutsideSystemError
from orchestrator.lineage import LineageStore
from orchestrator.lineage.schema import Generation, Step
from orchestrator.lineage.step_keys import train_key

REPO = Path(__file__).resolve().parents[2]


def spawn(tmp_path: Path, source: str, *args: str) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO)


def wait_for_line(proc: subprocess.Popen, wanted: str, timeout: float = 60.0) -> None:  # a loaded machine is slow
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip() == wanted:
            return
        if not line and proc.poll() is not None:
            break
    proc.kill()
    pytest.fail(f"child never printed {wanted!r}: {proc.stderr.read()}")


def sigkill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    proc.stdout.close()
    proc.stderr.close()


def test_sqlite_connections_use_wal_busy_timeout_and_foreign_keys(tmp_path):
    store = LineageStore(tmp_path / "l.db", busy_timeout_s=7)
    with store.engine.connect() as connection:
        pragmas = {name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()
                   for name in ("journal_mode", "busy_timeout", "foreign_keys")}
    assert pragmas == {"journal_mode": "wal", "busy_timeout": 7000, "foreign_keys": 1}


def test_two_stores_on_one_file_see_each_others_commits_only(tmp_path):
    a, b = LineageStore(tmp_path / "l.db"), LineageStore(f"sqlite:///{tmp_path}/l.db")
    a.upsert_generation("g0")
    assert [g.name for g in b.list_generations()] == ["g0"]
    with a.transaction() as session:
        session.add(Generation(name="g1", params={}, metrics={}))
        session.flush()
        assert [g.name for g in b.list_generations()] == ["g0"]  # not committed yet: invisible, not blocked
    assert [g.name for g in b.list_generations()] == ["g0", "g1"]
    b.upsert_generation("g2", parent="g1")
    assert a.get_generation("g2").parent == "g1"


def test_a_transaction_that_raises_leaves_no_partial_rows(tmp_path):
    store = LineageStore(tmp_path / "l.db")
    store.upsert_generation("g0")
    with pytest.raises(RuntimeError, match="midway"):
        with store.transaction() as session:
            session.add(Generation(name="g1", params={}, metrics={}))
            session.add(Step(key="train:g1", outputs={}))
            session.flush()
            raise RuntimeError("midway")
    # an API call failing midway is atomic too: the known pair is not written either
    with pytest.raises(LookupError, match="ghost"):
        store.record_compatibility([("g0", "g0", "cmc@1", 0.9, "d"), ("ghost", "g0", "cmc@1", 0.1, "d")])
    counts = store.row_counts()
    assert (counts["generations"], counts["steps"], counts["compatibility"]) == (1, 0, 0)


CHILD_KILLED_IN_TRANSACTION = """
    import sys, time
    from sqlalchemy import insert
    from orchestrator.lineage import LineageStore
    from orchestrator.lineage.schema import Generation, Step

    store = LineageStore(sys.argv[1])
    with store.transaction() as session:
        session.add(Generation(name="doomed", params={}, metrics={}))
        # ~8 MB of uncommitted rows: more than SQLite's page cache, so pages spill into the WAL
        session.execute(insert(Step), [{"key": f"doomed:{i}", "outputs": {}, "error": "x" * 1000}
                                       for i in range(8000)])
        session.flush()
        print("inside", flush=True)
        time.sleep(60)
    print("committed", flush=True)
"""


def test_sigkill_inside_a_long_transaction_leaves_a_consistent_database(tmp_path):
    db = tmp_path / "l.db"
    store = LineageStore(db)
    store.upsert_generation("g0", status="trained")
    store.commit_step("train:g0", {"checkpoint": "file:///g0"})
    before = store.row_counts()

    child = spawn(tmp_path, CHILD_KILLED_IN_TRANSACTION, f"sqlite:///{db}")
    try:
        wait_for_line(child, "inside")
        assert store.row_counts() == before  # readers are not blocked and see no uncommitted row
        wal = db.with_name(db.name + "-wal")
        assert wal.stat().st_size > 1_000_000  # uncommitted pages are on disk: recovery must skip them
        impatient = LineageStore(db, busy_timeout_s=0.2)
        # the child holds the write lock: the engine reports the database as the one line the CLI prints
        with pytest.raises(OutsideSystemError, match=f"^SQLite at {re.escape(f'sqlite:///{db}')}: database is locked; check "):
            impatient.upsert_generation("g1")
        impatient.close()
    finally:
        sigkill(child)

    store.close()
    reopened = LineageStore(db)
    assert reopened.row_counts() == before
    assert reopened.step_status("doomed:0") is None and not reopened.has_generation("doomed")
    reopened.upsert_generation("g1", parent="g0")  # writable again at once: the lock died with the child
    assert [g.name for g in reopened.list_generations()] == ["g0", "g1"]
    reopened.close()
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []


CHILD_DRIVER = """
    import json, os, sys, time
    from orchestrator.lineage import LineageStore
    from orchestrator.lineage.step_keys import train_key

    store = LineageStore(sys.argv[1])
    out = sys.argv[2]
    slow = sys.argv[3] == "slow"
    store.upsert_generation("g0", method="independent")
    for k in range(1, 6):
        store.upsert_generation(f"g{k}", parent=f"g{k-1}", method="bct")

    def write_atomically(path, payload):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    for k in range(6):
        key, name = train_key(f"g{k}"), f"g{k}"
        if store.start_step(key).status == "committed":
            continue
        store.set_generation_status(name, "training")
        path = os.path.join(out, f"{name}.ckpt")
        if slow and k == 3:
            print("training g3", flush=True)
            time.sleep(60)                       # killed here, mid-step
        write_atomically(path, json.dumps({"generation": name}))
        store.mark_generation_trained(name, path, "0" * 64, {"k": k}, step=key)
        print(f"committed {key}", flush=True)
    print("done", flush=True)
"""


def test_a_killed_driver_run_again_finishes_without_redoing_committed_steps(tmp_path):
    db, out = tmp_path / "l.db", tmp_path / "ckpt"
    out.mkdir()
    child = spawn(tmp_path, CHILD_DRIVER, f"sqlite:///{db}", str(out), "slow")
    try:
        wait_for_line(child, "training g3")
    finally:
        sigkill(child)

    store = LineageStore(db)
    assert [store.step_status(train_key(f"g{k}")) for k in range(6)] == ["committed"] * 3 + ["started", None, None]
    assert store.get_generation("g3").status == "training" and not (out / "g3.ckpt").exists()
    committed_at = {k: store.get_step(train_key(f"g{k}")).finished_at for k in range(3)}

    rerun = spawn(tmp_path, CHILD_DRIVER, f"sqlite:///{db}", str(out), "fast")
    stdout, stderr = rerun.communicate(timeout=30)
    assert rerun.returncode == 0, stderr
    assert [line for line in stdout.splitlines() if line.startswith("committed")] == [
        "committed train:g3", "committed train:g4", "committed train:g5"]  # g0..g2 not redone

    steps = store.steps()
    assert [(s.key, s.status, s.attempts) for s in steps] == [
        (train_key(f"g{k}"), "committed", 2 if k == 3 else 1) for k in range(6)]
    assert {k: store.get_step(train_key(f"g{k}")).finished_at for k in range(3)} == committed_at
    assert [g.status for g in store.list_generations()] == ["trained"] * 6
    assert store.row_counts()["generations"] == 6
    assert sorted(p.name for p in out.iterdir()) == [f"g{k}.ckpt" for k in range(6)]  # no temp files left


def test_concurrent_writers_neither_collide_nor_lose_updates(tmp_path):
    db = tmp_path / "l.db"
    shared = LineageStore(db)  # one store used from several threads, and stores of their own
    shared.upsert_generation("g0")
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        store = shared if i % 2 else LineageStore(db)
        try:
            for j in range(10):
                store.start_step("shared")  # read-modify-write of attempts on one row
                store.upsert_generation(f"w{j}", parent="g0")  # insert races on the same names
                store.record_compatibility([(f"w{j}", "g0", "cmc@1", i / 10, "d")])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            if store is not shared:
                store.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store = LineageStore(db)
    assert store.get_step("shared").attempts == 40
    counts = store.row_counts()
    assert (counts["generations"], counts["steps"], counts["compatibility"]) == (11, 1, 10)
