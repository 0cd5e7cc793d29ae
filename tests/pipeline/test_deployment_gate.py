"""The deployment gate through the CLI: g0-old (the session's served run, copied) → g1 where g1 is
trained with no compatibility (``independent``, a cosine space against g0-old's hyperbolic one), so
the criterion fails.

- ``hold`` (the default): exit 3 with the reason and the way on; nothing deployed, no shard changed,
  the gate's measurement and the failed deploy step are in the lineage, search serves g0-old;
- ``force`` (same run, a copy of the storage and its lineage): deployed over the planned partial backfill, recorded;
- ``full_backfill``: the plan escalates to a full re-embed, every item ends in a g1 shard, deployed.
The two re-runs only change the gate's action: training and the measurement are reused. Then a
rollback to g0-old and back (search follows), and gc counted file by file. A last
re-run with an edited training setting of g1 is refused, naming the step and the field."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from cli_runs import cli, cli_in_process
from g0_run import g0_config, write_pipeline
from orchestrator.lineage import LineageStore

pytestmark = pytest.mark.e2e

LIFELONG = Path(__file__).resolve().parents[2] / "pipelines" / "lifelong.yaml"
RAY_STARTED = "Started a local Ray instance"  # what Ray logs when `run` starts one


def shard_generations(store: LineageStore) -> dict[str, int]:
    counts: dict[str, int] = {}
    for shard in store.shards("digits-test"):
        if shard.n_items:
            counts[shard.generation] = counts.get(shard.generation, 0) + shard.n_items
    return counts


def gate_pipeline(folder: Path) -> Path:
    """The copied g0-old run's file (``folder/run``, its lineage inside) with lifelong.yaml's g1
    after it: 1 epoch, ``independent``, the gate's default action, trained by a Ray Train worker
    (its epoch checkpoints are among what gc collects; g0-old was trained in the driver)."""
    config = g0_config()
    config["ray"]["num_workers"] = 1
    config["evaluation"] = {"reference": None, "backfill_curves": False}
    g1 = next(g for g in yaml.safe_load(LIFELONG.read_text())["generations"] if g["name"] == "g1")
    g1["training"] = {**g1["training"], "epochs": 1}
    g1["method"] = {"name": "independent", "params": {}}
    config["generations"].append(g1)
    return write_pipeline(folder / "gate.yaml", config, folder / "run")


def test_hold_force_full_backfill_rollback_and_gc(tmp_path, copy_g0_run):
    copy_g0_run(tmp_path)
    pipeline = gate_pipeline(tmp_path)
    lineage = f"sqlite:///{tmp_path / 'run' / 'lineage.db'}"

    held = cli("run", str(pipeline), cwd=tmp_path)
    assert held.returncode == 3, held.stdout[-3000:] + held.stderr[-3000:]
    assert "orchestrator: held: gate of g1: failed (g1 → g0-old:" in held.stderr
    assert "g0-old keeps serving" in held.stderr and "generations.1.gate.action" in held.stderr
    assert RAY_STARTED in held.stderr  # when g1's training needed it, after g0-old's steps were skipped
    store = LineageStore(lineage)
    assert store.current_deployment().generation == "g0-old"
    assert shard_generations(store) == {"g0-old": 539}  # no shard changed
    gate = store.committed_outputs("gate:digits-test:g1")
    assert gate["serving"] == "g0-old" and [v[:2] for v in gate["verdicts"]] == [["g0-old", False]]
    # the gallery as served now, measured again on the same sample, is what g0-old's report measured
    # (the baseline the paired standard errors of the noise margin are taken against)
    assert gate["served_now"] == pytest.approx(gate["serving_quality"], abs=1e-5)
    assert 0 < gate["predicted_se"] < 0.05 and 0 < gate["full_backfill_se"] < 0.05
    deploy = store.get_step("deploy:g1")
    assert deploy.status == "failed" and "gate of g1: failed" in deploy.error
    store.close()

    search = cli_in_process("search", str(pipeline), "--split", "test", "--limit", "3", "-k", "2", "--json", cwd=tmp_path)
    assert search.returncode == 0, search.stderr[-2000:]
    assert json.loads(search.stdout)["serving"] == "g0-old"

    shutil.copytree(tmp_path / "run", tmp_path / "forced-run")  # the lineage inside; its locations are the storage's own
    forced_lineage = f"sqlite:///{tmp_path / 'forced-run' / 'lineage.db'}"
    forced = cli("run", str(pipeline), "--set", f"lineage={forced_lineage}", "--set", "generations.1.gate.action=force",
                 "--storage", str(tmp_path / "forced-run"), cwd=tmp_path)
    assert forced.returncode == 0, forced.stdout[-3000:] + forced.stderr[-3000:]
    assert "train:g1: already committed, skipped" in forced.stdout
    assert "gate:digits-test:g1: already committed, skipped" in forced.stdout  # measured once
    store = LineageStore(forced_lineage)
    assert store.current_deployment().generation == "g1"
    assert shard_generations(store) == {"g0-old": 270, "g1": 269}  # the planned half, as planned
    assert store.committed_outputs("deploy:g1")["gate"]["action"] == "force"
    store.close()

    escalated = cli("run", str(pipeline), "--set", "generations.1.gate.action=full_backfill", cwd=tmp_path)
    assert escalated.returncode == 0, escalated.stdout[-3000:] + escalated.stderr[-3000:]
    assert "plan:digits-test:g1:full: 4 shard update(s), 539 of 539 items" in escalated.stdout
    store = LineageStore(lineage)
    assert store.current_deployment().generation == "g1"
    assert shard_generations(store) == {"g1": 539}
    assert store.committed_outputs("deploy:g1")["gate"]["action"] == "full_backfill"
    # the gate predicted the fully re-embedded gallery (embedded in the driver, on the sample) as the
    # served gallery's evaluation then measured it (embedded by Ray Data): the figure the escalation
    # is held to (at least what g0-old served)
    gate = store.committed_outputs("gate:digits-test:g1")
    served = store.committed_outputs("gallery-eval:digits-test:g1")["mixed"]["map"]
    assert gate["full_backfill"] == pytest.approx(served, abs=1e-4) and gate["full_backfill"] >= gate["serving_quality"]
    store.close()

    # rollback: g0-old serves again with its own shards (still in storage), and search follows it
    def files(folder: Path) -> set[str]:
        return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}

    shard_files = files(tmp_path / "run" / "galleries" / "digits-test")
    shard_files = {f for f in shard_files if f.startswith("shard-")}
    assert len(shard_files) == 16  # 4 shards × (parquet + index) × (g0-old, g1)
    rollback = cli_in_process("deploy", str(pipeline), "--rollback", cwd=tmp_path)
    assert rollback.returncode == 0, rollback.stderr[-2000:]
    assert "g0-old serves queries again (was g1)" in rollback.stdout
    store = LineageStore(lineage)
    assert [d.generation for d in store.deployments()] == ["g0-old", "g1", "g0-old"]
    assert shard_generations(store) == {"g0-old": 539}
    store.close()
    search = cli_in_process("search", str(pipeline), "--split", "test", "--limit", "3", "-k", "2", "--json", cwd=tmp_path)
    served = json.loads(search.stdout)
    assert served["serving"] == "g0-old" and {h["generation"] for hits in served["results"] for h in hits} == {"g0-old"}
    assert cli_in_process("deploy", str(pipeline), "--generation", "g1", cwd=tmp_path).returncode == 0

    # gc: a dry run removes nothing; keeping one deployment removes g0-old's shard files and Ray
    # Train's epoch checkpoints, never what the lineage points at; search still serves g1
    ray_runs = {p.name for p in (tmp_path / "run" / "ray").iterdir()}
    assert {r.rsplit("-", 1)[0] for r in ray_runs} == {"train-g1"}
    dry = cli_in_process("gc", str(pipeline), "--keep-deployments", "1", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and "gc: would remove 9 file(s) / folder(s), kept 8" in dry.stdout
    assert {f for f in files(tmp_path / "run" / "galleries" / "digits-test") if f.startswith("shard-")} == shard_files
    collected = cli_in_process("gc", str(pipeline), "--keep-deployments", "1", cwd=tmp_path)
    assert collected.returncode == 0 and "gc: removed 9 file(s) / folder(s), kept 8" in collected.stdout
    left = {f for f in files(tmp_path / "run" / "galleries" / "digits-test") if f.startswith("shard-")}
    assert len(left) == 8 and all("/g1." in f for f in left) and left < shard_files
    assert not (tmp_path / "run" / "ray").exists() or not any((tmp_path / "run" / "ray").iterdir())
    assert (tmp_path / "run" / "generations" / "g0-old" / "card.json").exists()  # checkpoints are kept
    search = cli_in_process("search", str(pipeline), "--split", "test", "--limit", "3", "-k", "2", "--json", cwd=tmp_path)
    assert search.returncode == 0 and json.loads(search.stdout)["serving"] == "g1"
    gone = cli_in_process("deploy", str(pipeline), "--rollback", cwd=tmp_path)
    assert gone.returncode == 2 and "cannot be served again" in gone.stderr  # its files were collected

    # an edited committed step is refused, naming the step and the field, not skipped
    edited = cli("run", str(pipeline), "--set", "generations.1.training.epochs=2", cwd=tmp_path)
    assert edited.returncode == 2
    assert ("orchestrator: error: step 'train:g1' was committed with other settings; changed: "
            "generation.training.epochs (1 → 2)") in edited.stderr
    assert "give generation 'g1' a new name" in edited.stderr
    assert RAY_STARTED not in edited.stderr  # refused before any step needed Ray: none was started
