"""The runnable examples: the plug-in method pipeline (examples/custom_method) and the cluster
walkthrough (examples/cluster_walkthrough.sh). The quickstart is tested in tests/cli/test_cli.py.

The walkthrough is also the test of ``ray job submit --working-dir . -- orchestrator run FILE``
against a head started with ``ray start --head`` and token authentication on, as the README tells
users to do: the script submits the whole four-generation lifelong pipeline, and first shows that
a submission with a wrong token is refused for its token."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.lineage import LineageStore

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NUMBER = r"(?:[01]\.\d{4}|·)"


@pytest.mark.e2e
def test_custom_method_example_trains_the_plug_in_through_ray_train(tmp_path):
    storage = tmp_path / "run"
    # the example's file with its update's gate forced: one epoch leaves the plug-in's model below
    # the old one, which the gate would rightly hold; the plug-in's training is what this test checks
    config = yaml.safe_load((REPO / "examples" / "custom_method" / "pipeline.yaml").read_text())
    next(g for g in config["generations"] if g["name"] == "anchored")["gate"] = {"action": "force"}
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "ORCHESTRATOR_PLUGINS")}
    result = subprocess.run([sys.executable, str(REPO / "examples" / "custom_method" / "run.py"),
                             "--file", str(pipeline), "--epochs", "1", "--storage", str(storage)],
                            capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    out = result.stdout
    # both matrices, one row per generation, every cell a value
    for metric in ("cmc@1", "map"):
        assert re.search(rf"^{re.escape(metric)}\s+old\s+anchored\s+phi-star$", out, re.MULTILINE), out[-3000:]
    assert re.search(rf"^anchored(\s+{NUMBER}){{3}}$", out, re.MULTILINE), out[-3000:]
    # the update summary of the cosine_anchor generation, with P_com / P_up against phi-star
    # self, cross, old self (4 decimals), then backfill saved (2), P_com and P_up (3), each a value or
    # n/a (saved is one where the full backfill gains over the old self-test: a value on some machines'
    # one-epoch models, n/a on others)
    update = re.findall(r"^old → anchored\s+(cmc@1|map)\s+(?:-?\d+\.\d{4}\s+){3}(?:-?\d+\.\d{2}\s+|n/a\s+)"
                        r"(?:(?:-?\d+\.\d{3}|n/a)\s+){2}(yes|no)$", out, re.MULTILINE)
    assert [metric for metric, _ in update] == ["cmc@1", "map"], out[-3000:]
    assert "train:anchored: cosine_anchor on" in out

    store = LineageStore(f"sqlite:///{storage / 'lineage.db'}")
    try:
        generations = {g.name: g for g in store.list_generations()}
        assert set(generations) == {"old", "anchored", "phi-star"}
        assert generations["anchored"].method == "cosine_anchor" and generations["anchored"].parent == "old"
        assert all(g.status == "trained" for g in generations.values())
        assert store.current_deployment().generation == "anchored"
    finally:
        store.close()
    assert (storage / "generations" / "anchored" / "model.safetensors").is_file()


@pytest.mark.e2e
def test_cluster_walkthrough_submits_the_pipeline_and_prints_the_lineage(tmp_path):
    assert shutil.which("ray") and shutil.which("orchestrator"), \
        "needs the `ray` and `orchestrator` commands on PATH (pip install -e .)"
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")}
    env.update(EPOCHS="1", RUN_DIR=str(run_dir), PIPELINE="pipelines/quickstart.yaml")  # two generations
    result = subprocess.run(["bash", str(REPO / "examples" / "cluster_walkthrough.sh")], capture_output=True,
                            text=True, timeout=900, cwd=tmp_path, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    # token authentication is on: the script's submission with a wrong token was refused for it
    refusal = result.stdout.split("--- a submission with a wrong token", 1)[1].split("--- submitting", 1)[0]
    assert "Invalid authentication token" in refusal, refusal
    assert "this must not run" not in output
    assert "deploy:g1: g1 serves queries" in result.stdout
    lineage = result.stdout.split("--- lineage", 1)[1]
    assert re.search(r"^\s*(?:[│├└─ ]*)g1\s+hbct\s+trained\b.*\[serving\]$", lineage, re.MULTILINE), lineage
    assert re.search(r"^g0-old\s+hbct\s+trained\b", lineage, re.MULTILINE), lineage
    store = LineageStore(f"sqlite:///{run_dir / 'lineage.db'}")
    try:
        assert [(g.name, g.status) for g in store.list_generations()] == [
            ("g0-old", "trained"), ("g1", "trained")]
        assert store.current_deployment().generation == "g1"
    finally:
        store.close()
    assert not any(run_dir.glob("ray_token*")), "the token must not be left in the run folder"
