"""``ray job submit --working-dir . -- orchestrator run FILE`` against a head started with
``ray start --head`` and token authentication on, as the README tells users to do.

The submitted pipeline is lifelong.yaml cut to its first generation: what this test adds is the
hand-started head, the file path passed through the job, and a wrong token being refused. The
whole four-generation pipeline as a job on such a head is run by the cluster walkthrough test
(tests/examples/test_examples.py), which checks the same lineage this test checked before."""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.lineage import LineageStore

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    token = tmp_path / "ray_token"
    token.write_text(secrets.token_hex(32))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    env.pop("RAY_ADDRESS", None)
    dashboard = free_port()
    subprocess.run(["ray", "start", "--head", "--node-ip-address=127.0.0.1", f"--port={free_port()}",
                    f"--dashboard-port={dashboard}", "--dashboard-host=127.0.0.1", "--include-dashboard=true",
                    "--num-cpus=2", "--disable-usage-stats"], env=env, check=True, capture_output=True, timeout=180)
    try:
        yield f"http://127.0.0.1:{dashboard}", env
    finally:
        subprocess.run(["ray", "stop", "--force"], env=env, capture_output=True, timeout=120)


@pytest.mark.slow
def test_job_submit_runs_the_pipeline_and_a_wrong_token_is_refused(ray_head, tmp_path):
    address, env = ray_head
    config = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    config["storage"] = str(tmp_path / "run")
    config["generations"] = [g for g in config["generations"] if g["name"] == "g0-old"]
    config["generations"][0]["training"] = {**config["generations"][0]["training"], "epochs": 1}
    config["data"]["scenario"] = "extended_class"
    config["evaluation"] = {"reference": None}
    pipeline = tmp_path / "lifelong_first_generation.yaml"
    pipeline.write_text(yaml.safe_dump(config, sort_keys=False))

    wrong = {**env, "RAY_AUTH_TOKEN": "not-the-token"}
    refused = subprocess.run(["ray", "job", "submit", "--address", address, "--", "python", "-c", "print(1)"],
                             env=wrong, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0

    submitted = subprocess.run(
        ["ray", "job", "submit", "--address", address, "--working-dir", ".", "--",
         "orchestrator", "run", str(pipeline)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert submitted.returncode == 0, (submitted.stdout + submitted.stderr)[-4000:]
    assert "deploy:g0-old: g0-old serves queries" in submitted.stdout
    store = LineageStore(f"sqlite:///{tmp_path / 'run' / 'lineage.db'}")
    assert [(g.name, g.status) for g in store.list_generations()] == [("g0-old", "trained")]
    assert store.current_deployment().generation == "g0-old"
    assert [s.generation for s in store.shards("digits-test")] == ["g0-old"] * 4
    store.close()
