"""End to end: a generation that learns nothing stops the run at its train step (issue 38, item 1).

pipelines/lifelong.yaml cut to g0-old (one epoch, healthy, served: the session's run, copied) and
g1 trained with Adam at lr 10 for two epochs: HBCT's loss stays finite (2.73, then 2.36; its base
term ln 10 = 2.3026: flat logits) and g1's embeddings collapse to chance (own CMC@1 0.100, then
0.098, measured over four epochs: 0.068-0.112, chance 0.098; at lr 1.0 it still recovered to
0.27-0.63). ``orchestrator run`` exits 7 with one line naming g1, its epochs and what was seen;
the lineage holds train:g1 failed with that line, g1 failed, and no evaluate, plan, gate or
deploy step of g1; nothing of g1 was written.
"""
from __future__ import annotations

import json
import re

import pytest

from tests.cli_runs import cli, cli_in_process
from tests.pipeline.g0_run import g0_config, write_pipeline

pytestmark = pytest.mark.e2e


def test_a_generation_that_learns_nothing_stops_at_its_train_step(tmp_path, copy_g0_run):
    copy_g0_run(tmp_path)  # g0-old trained and served already (the session's run, copied into tmp_path/run)
    config = g0_config()
    g1 = {**config["generations"][0], "name": "g1", "parent": "g0-old", "classes": None,
          "method": {"name": "hbct", "params": {"clip": 1.2}},
          "training": {"epochs": 2, "batch_size": 64, "optimizer": "adam", "lr": 10.0, "augment": False},
          "backfill": {"policy": "full"}}
    config["generations"].append(g1)
    storage = tmp_path / "run"
    path = write_pipeline(tmp_path / "health.yaml", config, storage)

    run = cli("run", str(path), cwd=tmp_path)
    assert run.returncode == 7, run.stdout[-3000:] + run.stderr[-3000:]
    err = [line for line in run.stderr.splitlines() if line.startswith("orchestrator:")]  # Ray logs there too
    assert len(err) == 1, run.stderr
    found = re.match(r"orchestrator: unhealthy: g1: own CMC@1 (\d\.\d{3}) after 2 epochs, chance is (\d\.\d{3}) ", err[0])
    assert found, err[0]
    own, chance = float(found[1]), float(found[2])
    assert chance == pytest.approx(0.098, abs=0.001)  # 500 test items of the 10 digits
    assert own < 0.139  # near chance: below chance + 3σ
    assert "train:g1 failed, nothing of g1 was evaluated or deployed" in err[0] and "generations.1.health" in err[0]
    assert "train:g1: stopped by the health check: g1: own CMC@1" in run.stdout

    lineage = json.loads(cli_in_process("lineage", str(path), "--json", cwd=tmp_path).stdout)
    steps = {step["key"]: step for step in lineage["steps"]}
    assert steps["train:g1"]["status"] == "failed"
    assert steps["train:g1"]["error"] == "stopped by the health check: " + err[0].removeprefix("orchestrator: unhealthy: ") \
        .split("; train:g1 failed")[0]
    assert not [key for key in steps if key != "train:g1" and key.endswith(":g1")], sorted(steps)
    assert steps["deploy:g0-old"]["status"] == "committed"  # g0-old, healthy, was served
    assert steps["train:g0-old"]["outputs"]["health"]["own_cmc@1"] > 0.5
    generations = {g["name"]: g for g in lineage["generations"]}
    assert generations["g1"]["status"] == "failed" and generations["g1"]["checkpoint_uri"] is None
    assert lineage["current_deployment"]["generation"] == "g0-old"
    assert not (storage / "generations" / "g1" / "model.safetensors").exists()

    text = cli_in_process("lineage", str(path), cwd=tmp_path).stdout
    assert re.search(r"failed\s+train:g1 \(attempt 1\): stopped by the health check: g1: own CMC@1 \d\.\d{3} after 2 "
                     r"epochs, chance is 0\.098", text), text
