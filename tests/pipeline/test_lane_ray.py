"""The end-to-end tests' commands share one Ray per lane (``tests/lane_ray.py``): a forked
``orchestrator run`` joins it, and the commands whose own Ray is what they test keep their own."""
from __future__ import annotations

import os

import pytest

import lane_ray
from cli_runs import joins_lane_ray, orchestrator_process
from g0_run import g0_config, write_pipeline


@pytest.mark.parametrize(("args", "variables", "new_session", "own_ray", "joins"), [
    (("run", "p.yaml"), {}, False, False, True),
    (("tune", "p.yaml"), {}, False, False, True),
    (("lineage",), {}, False, False, False),           # starts no Ray
    (("serve", "p.yaml"), {}, False, False, False),    # Serve outlives a job: its own Ray, always
    (("run", "p.yaml"), {}, True, False, False),       # killed with its process group
    (("run", "p.yaml"), {}, False, True, False),       # asked for (its dashboard)
    (("run", "p.yaml"), {"RAY_ADDRESS": "127.0.0.1:1"}, False, False, False),
    (("run", "p.yaml"), {"ORCHESTRATOR_PLUGINS": "plugin"}, False, False, False),
    (("run", "p.yaml"), {"ORCHESTRATOR_PLUGINS": ""}, False, False, True),
])
def test_which_commands_join_the_lanes_ray(args, variables, new_session, own_ray, joins):
    assert joins_lane_ray(args, variables, new_session, own_ray) is joins


@pytest.mark.e2e
def test_a_forked_run_is_a_driver_of_the_lanes_ray(tmp_path, copy_g0_run):
    copy_g0_run(tmp_path)
    config = g0_config()
    g1 = {**config["generations"][0], "name": "g1", "parent": "g0-old", "classes": None,
          "method": {"name": "hbct", "params": {"clip": 1.2}}, "backfill": {"policy": "none"}}
    config["generations"].append(g1)
    pipeline = write_pipeline(tmp_path / "joined.yaml", config, tmp_path / "run")
    env = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}

    run = orchestrator_process("run", str(pipeline), cwd=tmp_path, env=env)
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, out[-3000:] + (err or "")[-3000:]
    assert "train:g1" in out
    assert run.pid in lane_ray.driver_pids()
