"""Run locks on SQLite and on a real PostgreSQL server: a second taker is refused with a message
naming the holder (another store in this process, or another process), the lock is free again when
the holder finishes or is killed, and a pipeline run refused this way records nothing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.config import load_pipeline
from orchestrator.lineage import LineageBusy, LineageStore
from orchestrator.pipeline.runner import PipelineRunner

REPO = Path(__file__).resolve().parents[2]
HOLDER = """
import sys, time
from orchestrator.lineage import LineageStore
store = LineageStore(sys.argv[1])
with store.run_lock(sys.argv[2], "orchestrator run"):
    print("locked", flush=True)
    time.sleep(120)
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lineage.db'}"
    return request.getfixturevalue("postgres_url")


def hold_in_another_process(url: str, pipeline: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-c", HOLDER, url, pipeline], stdout=subprocess.PIPE, text=True, env=env)
    assert process.stdout.readline().strip() == "locked"
    return process


def acquire_within(store: LineageStore, pipeline: str, seconds: float) -> bool:
    """Whether the lock could be taken within ``seconds`` (a killed holder's session ends asynchronously)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with store.run_lock(pipeline, "test"):
                return True
        except LineageBusy:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)


def test_a_second_taker_is_refused_naming_the_holder_until_it_releases(url):
    first, second = LineageStore(url), LineageStore(url)
    with first.run_lock("tiny", "orchestrator run"):
        with first.run_lock("tiny", "pipeline run"):  # reentrant in the holder
            pass
        with pytest.raises(LineageBusy) as busy:
            with second.run_lock("tiny", "orchestrator gc"):
                pytest.fail("two holders at once")
        message = str(busy.value)
        assert "pipeline 'tiny' is held by " in message and f"(pid {os.getpid()}, orchestrator run)" in message
        with second.run_lock("other", "orchestrator run"):  # another pipeline is not held
            assert second.row_counts()["run_locks"] == 2
    with second.run_lock("tiny", "orchestrator gc"):
        assert second.row_counts()["run_locks"] == 1
    assert first.row_counts()["run_locks"] == 0  # released locks leave no holder row
    first.close(), second.close()


def test_a_lock_held_by_another_process_is_refused_and_freed_when_it_is_killed(url):
    store = LineageStore(url)
    holder = hold_in_another_process(url, "tiny")
    try:
        with pytest.raises(LineageBusy, match=rf"\(pid {holder.pid}, orchestrator run\)"):
            with store.run_lock("tiny", "orchestrator run"):
                pytest.fail("taken while another process holds it")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert acquire_within(store, "tiny", 10.0)  # no clean-up ran in the killed holder
    store.close()


def test_a_refused_pipeline_run_records_nothing(url, tmp_path):
    config = load_pipeline(REPO / "pipelines" / "lifelong.yaml", {"storage": str(tmp_path / "run"), "lineage": url})
    holder = LineageStore(url)  # another store holds it: as another process's would
    runner = PipelineRunner(config, progress=lambda line: None)
    with holder.run_lock(config.name, "orchestrator tune"):
        with pytest.raises(LineageBusy, match=rf"pipeline '{config.name}' is held by .*orchestrator tune"):
            runner.run()
        with pytest.raises(LineageBusy):
            runner.train_generations([config.generations[0].name])
    holder.close()
    counts = runner.store.row_counts()
    assert counts["pipeline_runs"] == counts["steps"] == counts["generations"] == 0
    runner.store.close()


def test_a_taker_arriving_before_the_holder_records_itself_still_names_it(url, monkeypatch):
    """The holder takes the lock, then writes its row: a taker in between waits for the row."""
    import threading

    from orchestrator.lineage import locks

    first, second = LineageStore(url), LineageStore(url)
    recorded = locks.RunLocks._record
    refusals: list[str] = []

    def late_record(self, pipeline, holder):
        def try_second():
            try:
                with second.run_lock(pipeline, "orchestrator gc"):
                    refusals.append("taken")
            except LineageBusy as busy:
                refusals.append(str(busy))
        taker = threading.Thread(target=try_second)
        taker.start()
        time.sleep(0.5)  # the taker asks while no row exists
        recorded(self, pipeline, holder)
        taker.join()

    monkeypatch.setattr(locks.RunLocks, "_record", late_record)
    with first.run_lock("tiny", "orchestrator run"):
        pass
    assert len(refusals) == 1 and f"(pid {os.getpid()}, orchestrator run)" in refusals[0], refusals
    first.close(), second.close()
