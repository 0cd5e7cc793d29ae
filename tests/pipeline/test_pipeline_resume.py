"""The lifelong pipeline end to end through Ray, killed mid-way and run again.

The driver (and the local Ray instance it started) is killed with SIGKILL while the second
generation trains. Running the same command again must finish the pipeline without redoing
committed steps, with exactly one row per generation, step and compatibility value, and the
first generation's checkpoint untouched.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.lineage import LineageStore

REPO = Path(__file__).resolve().parents[2]
GENERATIONS = ["g0-old", "g1", "g2", "phi-star"]


def small_pipeline(tmp_path: Path) -> Path:
    """pipelines/lifelong.yaml with short training, storage under tmp_path."""
    config = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    config["storage"] = str(tmp_path / "run")
    for generation in config["generations"]:
        generation["training"] = {**generation["training"], "epochs": 3}
    path = tmp_path / "lifelong_small.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def step_status(db: Path, key: str) -> str | None:
    if not db.exists():
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as connection:
            row = connection.execute("select status from steps where key = ?", (key,)).fetchone()
    except sqlite3.OperationalError:
        return None
    return row[0] if row else None


def run_cli(pipeline: Path, cwd: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "run", str(pipeline)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kwargs)


@pytest.mark.slow
def test_killed_driver_resumes_without_redoing_or_duplicating(tmp_path):
    pipeline = small_pipeline(tmp_path)
    db = tmp_path / "run" / "lineage.db"
    first = run_cli(pipeline, tmp_path)
    deadline = time.time() + 400
    while time.time() < deadline and step_status(db, "train:g1") != "started":
        if first.poll() is not None:
            pytest.fail("the first run ended before it could be killed:\n" + first.stdout.read()[-3000:])
        time.sleep(0.5)
    assert step_status(db, "train:g1") == "started", "the second generation never started training"
    time.sleep(3)  # inside g1's training
    os.killpg(first.pid, signal.SIGKILL)  # the driver and the local Ray it started
    first.wait(timeout=30)
    first.stdout.close()

    store = LineageStore(f"sqlite:///{db}")
    g0_before = store.get_generation("g0-old")
    assert g0_before.status == "trained" and store.step_status("evaluate:g0-old") == "committed"
    assert store.get_generation("g1").status == "training"
    store.close()
    g0_weights = (tmp_path / "run" / "generations" / "g0-old" / "model.safetensors").read_bytes()

    second = run_cli(pipeline, tmp_path)
    out, _ = second.communicate(timeout=900)
    assert second.returncode == 0, out[-4000:]
    assert "train:g0-old: already committed, skipped" in out
    assert "evaluate:g0-old: already committed, skipped" in out

    store = LineageStore(f"sqlite:///{db}")
    counts = store.row_counts()
    assert counts["generations"] == 4
    assert counts["steps"] == 2 * 4 + 1  # train + evaluate per generation, one deploy
    assert all(step.status == "committed" for step in store.steps())
    attempts = {step.key: step.attempts for step in store.steps()}
    assert attempts["train:g0-old"] == 1 and attempts["evaluate:g0-old"] == 1  # not redone
    assert attempts["train:g1"] == 2  # interrupted once, finished on the re-run
    # one value per (query, gallery ≤ query, metric): 1 + 2 + 3 + 4 pairs × 3 metrics
    assert counts["compatibility"] == (1 + 2 + 3 + 4) * 3
    assert store.get_generation("g0-old").sha256 == g0_before.sha256
    assert store.current_deployment().generation == "g2"
    store.close()
    assert (tmp_path / "run" / "generations" / "g0-old" / "model.safetensors").read_bytes() == g0_weights
    assert sorted(p.name for p in (tmp_path / "run" / "generations").iterdir()) == sorted(GENERATIONS)
    leftovers = [p for p in (tmp_path / "run" / "generations").rglob("*") if ".tmp-" in p.name]
    assert not leftovers
    for name in ("compatibility.json", "compatibility.csv", "compatibility_map.png"):
        assert (tmp_path / "run" / "reports" / name).stat().st_size > 0
