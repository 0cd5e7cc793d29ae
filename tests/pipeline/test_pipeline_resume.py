"""The lifelong pipeline end to end through Ray, killed and failed at its worst moments, run again,
from the session's served g0-old run (copied; the same g0-old as this file's):

1. The driver (and the local Ray it started) is SIGKILLed while the second generation trains:
   after its first of three epochs, in the driver (``ray.num_workers`` 0, Ray Train's local mode;
   killed Ray Train workers are tests/distributed/test_ray_train.py's).
2. The re-run fails while g1 backfills the gallery: a file sits where the last new shard's folder
   must go, so that shard's write fails after other shards may have committed.
3. With the obstacle gone, the next run is SIGKILLed while g2 re-embeds shards through Ray Data.
4. The last run finishes.
After every interruption the gallery is consistent: each item in exactly one committed shard,
each shard's files matching the lineage's sha256, generation and size. At the end every step is
committed once, with no duplicate rows or files, and earlier checkpoints untouched.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from cli_runs import Running, orchestrator_process
from orchestrator.data import load_digits
from orchestrator.gallery import read_shard
from orchestrator.index import ShardIndex
from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import StepKind, evaluate_key, plan_key, shard_update_key
from orchestrator.storage import read_json

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GENERATIONS = ["g0-old", "g1", "g2"]


def small_pipeline(tmp_path: Path) -> Path:
    """pipelines/lifelong.yaml without the reference φ*, one epoch per generation (nothing here
    depends on model quality) but three for g1 (the first run is killed after g1's first), backfill
    curves, storage under tmp_path, training in the driver."""
    config = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    config["storage"] = str(tmp_path / "run")
    config["evaluation"] = {"reference": None, "backfill_curves": True}  # no φ*: one training less
    config["generations"] = [g for g in config["generations"] if g["name"] != "phi-star"]
    for generation in config["generations"]:
        generation["training"] = {**generation["training"], "epochs": 3 if generation["name"] == "g1" else 1}
        generation["gate"] = {"action": "force"}  # 1 epoch may fail the gate: not what this test checks
    config["ray"]["num_workers"] = 0
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


def run_cli(pipeline: Path, cwd: Path):
    return orchestrator_process("run", str(pipeline), cwd=cwd, merge_stderr=True, new_session=True)


class Lines(threading.Thread):
    """A run's output lines as they come (``lines``), so a test can act on one."""

    def __init__(self, process: Running):
        super().__init__(daemon=True)
        self.process, self.lines = process, []
        self.start()

    def run(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def seen(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def text(self) -> str:
        return "".join(self.lines)


def wait_until(predicate, process: Running, what: str, timeout: float = 400, output=None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and not predicate():
        if process.poll() is not None:
            pytest.fail(f"the run ended before {what}:\n" + (output or process.stdout.read)()[-3000:])
        time.sleep(0.05)
    assert predicate(), f"timed out waiting for {what}"


def kill(process: Running, reader: Lines | None = None) -> None:
    os.killpg(process.pid, signal.SIGKILL)  # the driver and the local Ray it started
    process.wait(timeout=30)
    if reader is not None:
        reader.join(timeout=30)  # the pipe ends with the killed group
    process.stdout.close()


def committed_steps(db: Path, pattern: str) -> list[str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as connection:
        return [k for (k,) in connection.execute("select key from steps where status = 'committed' and key like ?",
                                                 (pattern,))]


def assert_gallery_consistent(db: Path) -> dict[int, str]:
    """Every gallery item in exactly one committed shard whose files match the lineage; returns
    shard index → generation."""
    store = LineageStore(f"sqlite:///{db}")
    try:
        shards = [s for s in store.shards("digits-test") if s.generation is not None]
        ids = []
        for shard in shards:
            data = read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)
            assert (data.generation, len(data)) == (shard.generation, shard.n_items)
            index = ShardIndex.load(shard.index_uri)
            assert index.ntotal == shard.n_items
            _, found = index.search(data.embeddings[:1], 1)
            assert found[0, 0] == data.ids[0]  # the index holds this shard's items
            ids.append(data.ids)
        every = np.concatenate(ids)
        assert np.unique(every).size == every.size, "an item is in two shards"
        assert np.array_equal(np.sort(every), np.sort(load_digits("test").ids)), "an item is missing"
        return {s.index: s.generation for s in shards}
    finally:
        store.close()


@pytest.mark.e2e
def test_killed_driver_resumes_without_redoing_or_duplicating(tmp_path, copy_g0_run):
    copy_g0_run(tmp_path)
    pipeline = small_pipeline(tmp_path)
    db = tmp_path / "run" / "lineage.db"
    first = run_cli(pipeline, tmp_path)
    lines = Lines(first)
    wait_until(lambda: lines.seen("train:g1: epoch 1/3"), first, "g1's first epoch", output=lines.text)
    kill(first, lines)  # inside g1's training: two epochs to go
    assert not lines.seen("train:g1: done")

    store = LineageStore(f"sqlite:///{db}")
    g0_before = store.get_generation("g0-old")
    assert g0_before.status == "trained" and store.step_status("evaluate:g0-old") == "committed"
    assert store.get_generation("g1").status == "training"
    store.close()
    assert set(assert_gallery_consistent(db).values()) == {"g0-old"}
    g0_weights = (tmp_path / "run" / "generations" / "g0-old" / "model.safetensors").read_bytes()

    # 2. g1 backfills half of the items (4 splits into new shards 4-7); shard 7 cannot be written
    obstacle = tmp_path / "run" / "galleries" / "digits-test" / "shard-00007"
    obstacle.write_text("not a folder")
    second = run_cli(pipeline, tmp_path)
    out, _ = second.communicate(timeout=900)
    assert second.returncode != 0 and "shard-00007" in out, out[-3000:]
    assert "train:g0-old: already committed, skipped" in out
    plan = read_json(LineageStore(f"sqlite:///{db}").committed_outputs("plan:digits-test:g1")["plan_uri"])
    assert [e["target"] for e in plan["entries"]] == [4, 5, 6, 7], "g1's plan should split all four shards"
    failed = [e for e in plan["entries"] if e["target"] == 7][0]
    assert step_status(db, shard_update_key(StepKind.SPLIT, "digits-test", failed["shard"], "g1")) == "failed"
    assert_gallery_consistent(db)

    # 3. killed while g2 re-embeds whole shards
    obstacle.unlink()
    third = run_cli(pipeline, tmp_path)
    wait_until(lambda: step_status(db, "plan:digits-test:g2") == "committed", third, "g2's plan")
    time.sleep(1.0)  # the Ray Data actors are starting or embedding; no g2 shard has committed
    kill(third)
    g2_plan = read_json(LineageStore(f"sqlite:///{db}").committed_outputs("plan:digits-test:g2")["plan_uri"])
    assert len(committed_steps(db, "embed:digits-test/%:g2")) < len(g2_plan["entries"])
    assert "g2" not in assert_gallery_consistent(db).values()

    fourth = run_cli(pipeline, tmp_path)
    out, _ = fourth.communicate(timeout=900)
    assert fourth.returncode == 0, out[-4000:]
    assert "evaluate:g0-old: already committed, skipped" in out

    holders = assert_gallery_consistent(db)
    store = LineageStore(f"sqlite:///{db}")
    counts = store.row_counts()
    assert counts["generations"] == len(GENERATIONS)
    plans = {g: read_json(store.committed_outputs(plan_key("digits-test", g))["plan_uri"]) for g in ("g0-old", "g1", "g2")}
    # train + evaluate per generation; per served generation: plan, one step per entry, deploy, gallery-eval;
    # a gate for each generation deployed while another served (g1, g2), none for g0-old on the re-runs
    pipeline_steps = [s for s in store.steps() if not s.key.startswith(StepKind.INTEGRITY.prefix)]  # + one per index file
    assert len(pipeline_steps) == 2 * len(GENERATIONS) + sum(3 + len(p["entries"]) for p in plans.values()) + 2
    assert sorted(s.key for s in store.steps() if s.key.startswith(StepKind.GATE.prefix)) == ["gate:digits-test:g1",
                                                                                 "gate:digits-test:g2"]
    assert all(step.status == "committed" for step in store.steps())
    attempts = {step.key: step.attempts for step in store.steps()}
    assert attempts["train:g0-old"] == 1 and attempts["evaluate:g0-old"] == 1  # not redone
    assert attempts["train:g1"] == 2  # interrupted once, finished on the re-run
    assert attempts[shard_update_key(StepKind.SPLIT, "digits-test", failed["shard"], "g1")] == 2
    # one value per (query, gallery ≤ query, metric): 1 + 2 + 3 pairs × 3 metrics
    assert counts["compatibility"] == (1 + 2 + 3) * 3
    # every generation embedded the evaluation split once, into the file its evaluate step records
    assert all(store.committed_outputs(evaluate_key(g))["eval_embeddings"]["items"] == 539 for g in GENERATIONS)
    assert store.get_generation("g0-old").sha256 == g0_before.sha256
    assert [d.generation for d in store.deployments()] == ["g0-old", "g1", "g2"]
    # the budgets: g1 moved ⌊0.5·539⌋ items into 4 new shards, g2 re-embedded 4 of the 8 shards whole
    assert sum(e["num_items"] for e in plans["g1"]["entries"]) == 269
    assert [e["kind"] for e in plans["g2"]["entries"]] == ["embed"] * 4
    assert sorted(holders.values()).count("g2") == 4 and len(holders) == 8
    backfills = [(b.shard_index, b.from_generation, b.to_generation, b.status) for b in store.backfills("digits-test")]
    assert len(backfills) == len(set(backfills))  # no duplicate backfill rows
    store.close()
    assert (tmp_path / "run" / "generations" / "g0-old" / "model.safetensors").read_bytes() == g0_weights
    assert sorted(p.name for p in (tmp_path / "run" / "generations").iterdir()) == sorted(GENERATIONS)
    leftovers = [p for p in (tmp_path / "run").rglob("*") if ".tmp-" in p.name]
    assert not leftovers
    reports = tmp_path / "run" / "reports"
    for name in ("compatibility.json", "compatibility.csv", "compatibility_map.png", "gallery-digits-test.csv",
                 "backfill-digits-test-g1.png", "backfill-digits-test-g2.csv"):
        assert (reports / name).stat().st_size > 0
    # what the search router served through the flat indexes: the exact mixed ranking when it
    # searched every item; otherwise the report names the shards it did not search and why
    for row in read_json(str(reports / "gallery-digits-test.json")):
        searched, total = (int(n) for n in row["searched items"].split("/"))
        assert total == 539
        if searched == total:
            assert not row["not searched"]
            # the index holds float32 and the exact ranking float64: near-ties of these 1-epoch
            # models may swap, nothing more
            assert row["search map"] == pytest.approx(row["mixed map"], abs=1e-3)
            assert row["search cmc@1"] == pytest.approx(row["mixed cmc@1"], abs=2 / 539)
        else:
            assert "below the compatibility criterion" in row["not searched"]
