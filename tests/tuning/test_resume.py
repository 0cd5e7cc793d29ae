"""``orchestrator tune FILE`` killed mid-sweep (SIGKILL of the driver) and run again resumes the
experiment with ``Tuner.restore``: trials that had finished are not run again, the others are, and
the results hold every trial once. The sweep searches with Optuna (its state is restored too), on
the small pipeline with one-epoch candidates (the parent is the one the other sweeps trained)."""
from __future__ import annotations

import csv
import os
import re
import signal
import threading
import time

import pytest
import yaml

from cli_runs import orchestrator_process
from orchestrator.lineage import LineageStore
from orchestrator.tuning.saved_state import damaged_state_files

pytestmark = pytest.mark.e2e

TRIALS = 4
FINISHED = re.compile(r"trial (\S+) finished after 1/1 epochs")
STARTED = re.compile(r"trial (\S+) started")


class Driver:
    """``orchestrator tune`` in a subprocess joined to the test's Ray; its output lines, each with
    the time it was read."""

    def __init__(self, path, cwd, ray_address):
        # TUNE_GLOBAL_CHECKPOINT_S: Tune saves the experiment state every second (default: at most
        # every 10 s), so the kill can follow the finished trials closely
        env = {**os.environ, "RAY_ADDRESS": ray_address, "TUNE_GLOBAL_CHECKPOINT_S": "1"}
        self.process = orchestrator_process("tune", str(path), cwd=cwd, env=env, merge_stderr=True)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def matches(self, pattern, before=float("inf")):
        return [m.group(1) for t, line in list(self.lines) if t < before for m in [pattern.search(line)] if m]

    def text(self):
        return "\n".join(line for _t, line in self.lines)


def saved_after(experiment, moment) -> bool:
    states = [p for pattern in ("experiment_state-*", "search_gen_state-*", "searcher-state-*")
              for p in experiment.glob(pattern)]
    return (len(states) == 3 and all(p.stat().st_mtime > moment for p in states)
            and not damaged_state_files(str(experiment)))


def test_a_killed_sweep_resumes_without_rerunning_finished_trials(small, ray_address):
    config = yaml.safe_load(small.pipeline.read_text())
    for generation in config["generations"]:
        if generation["name"] == "g1":
            generation["training"]["epochs"] = 1
    pipeline = small.folder / "pipeline_one_epoch.yaml"
    pipeline.write_text(yaml.safe_dump(config, sort_keys=False))
    path = small.tune_file("resume", pipeline=str(pipeline), space={"lam": {"loguniform": [0.03, 3.0]}},
                           search={"algorithm": "optuna", "num_samples": TRIALS, "seed": 0},
                           scheduler={"kind": "fifo"}, max_concurrent_trials=1)
    experiment = small.storage / "tune" / "resume" / "experiment"

    first = Driver(path, small.folder, ray_address)
    deadline = time.time() + 240
    while len(first.matches(FINISHED)) < 2:
        assert first.process.poll() is None, "the sweep ended before it could be killed:\n" + first.text()[-3000:]
        assert time.time() < deadline, first.text()[-3000:]
        time.sleep(0.2)
    second_finish = time.time()
    # Tune saves the experiment state every few seconds, then copies it into the sweep folder: wait
    # for a save after the second finish whose copy is done (every state file dated after it, whole)
    while not saved_after(experiment, second_finish):
        assert first.process.poll() is None, "the sweep ended before it could be killed:\n" + first.text()[-3000:]
        assert time.time() < deadline, first.text()[-3000:]
        time.sleep(0.2)
    saved_at = max(p.stat().st_mtime for p in experiment.glob("experiment_state-*.json"))
    os.kill(first.process.pid, signal.SIGKILL)  # the driver only; the test's Ray stays up
    first.process.wait(timeout=30)
    first.reader.join(timeout=10)
    done_before = first.matches(FINISHED, before=saved_at)
    assert len(done_before) >= 2
    unfinished = TRIALS - len(first.matches(FINISHED))
    assert unfinished >= 1, "every trial finished before the kill:\n" + first.text()[-3000:]
    results_before = {t: (experiment / t / "result.json").read_bytes() for t in done_before}

    second = Driver(path, small.folder, ray_address)
    assert second.process.wait(timeout=600) == 0, second.text()[-4000:]
    second.reader.join(timeout=10)
    assert "sweep resume: resuming" in second.text()
    restarted = second.matches(STARTED)
    assert restarted and not set(restarted) & set(done_before), second.text()[-3000:]
    assert {t: (experiment / t / "result.json").read_bytes() for t in done_before} == results_before

    with open(small.storage / "tune" / "resume" / "trials.csv") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == TRIALS and len({row["trial_id"] for row in table}) == TRIALS
    assert set(done_before) <= {row["trial_id"] for row in table}
    assert all(row["outcome"] == "finished" and row["epochs"] == "1" for row in table)
    assert all(0.03 <= float(row["param_lam"]) <= 3.0 for row in table)
    store = LineageStore(f"sqlite:///{small.storage}/lineage.db")
    assert sorted(c.trial_id for c in store.candidates("resume")) == sorted(row["trial_id"] for row in table)
