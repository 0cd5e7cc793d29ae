"""The pipeline on a real multi-node Ray cluster: clusters/local_multinode.sh starts a head and two
worker nodes on this machine (1 CPU each, token authentication on); `orchestrator run` joins it
with --ray-address. Training asks for 2 Ray Train workers and the gallery step for 2 embedding
actors of 1 CPU each (Ray Data's actor pool); with one CPU per node, each pair must span two nodes.
Ray's state API (through the cluster's dashboard, with the token) tells where they ran, and the
lineage which node wrote each shard (the step's finish tasks, spread over the nodes)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import StepKind, shard_update_key

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "clusters" / "local_multinode.sh"


def one_generation_pipeline(tmp_path: Path) -> Path:
    config = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    config["generations"] = [g for g in config["generations"] if g["name"] == "g0-old"]
    config["generations"][0]["training"] = {**config["generations"][0]["training"], "epochs": 1}
    config["data"]["scenario"] = "extended_class"
    config["evaluation"] = {"reference": None}
    config["ray"] = {**config["ray"], "num_workers": 2, "cpus_per_worker": 1}
    config["gallery"]["embedding"] = {"batch_size": 32, "concurrency": 2, "num_cpus": 1}
    config["storage"] = str(tmp_path / "run")
    path = tmp_path / "multinode.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def cluster_env(state: Path) -> dict[str, str]:
    """The environment of the run and of the placement check: the cluster's token."""
    values = dict(line.split("=", 1) for line in (state / "cluster.env").read_text().split())
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=values["RAY_AUTH_TOKEN_PATH"])
    # Ray Data starts a pool's actors without waiting for them: on a small gallery the first actor
    # placed (while Ray Train's workers still hold the other nodes' CPUs) can embed every item
    # before the second one starts. The placement check needs both to have worked: wait for them.
    env["RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S"] = "120"
    return env | {"GCS": values["GCS_ADDRESS"], "DASHBOARD": values["DASHBOARD"]}


PLACEMENT = """
import json, os
import ray
from ray.util.state import list_actors
ray.init(address=os.environ["GCS"], log_to_driver=False)
nodes = {}
for actor in list_actors(address=os.environ["DASHBOARD"], limit=10000, detail=True):
    for kind in ("RayTrainWorker", "EmbedAndStage", "Finisher"):
        # node_id is None for an actor that was never placed (e.g. requested by the pool, then cancelled)
        if kind in actor.class_name and actor.node_id is not None:
            nodes.setdefault(kind, set()).add(actor.node_id)
print(json.dumps({k: sorted(v) for k, v in nodes.items()}))
print(json.dumps(len([n for n in ray.nodes() if n["Alive"]])))
"""


def test_training_workers_and_embedding_actors_span_nodes(tmp_path):
    # a short state dir: Ray's unix socket paths under it must stay below 107 characters
    state = Path(tempfile.mkdtemp(prefix="orc-", dir="/tmp")) / "cl"
    script_env = {**os.environ, "LOCAL_RAY_DIR": str(state), "NUM_CPUS": "1"}
    up = subprocess.run(["bash", str(SCRIPT), "up", "2"], env=script_env, capture_output=True, text=True, timeout=400)
    if up.returncode != 0:  # `up` already stopped and removed what it started
        shutil.rmtree(state.parent, ignore_errors=True)
        pytest.fail(up.stdout + up.stderr)
    try:
        env = cluster_env(state)
        run = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(one_generation_pipeline(tmp_path)),
                              "--ray-address", env["GCS"]], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        placed = subprocess.run([sys.executable, "-c", PLACEMENT], env=env, capture_output=True, text=True, timeout=120)
        assert placed.returncode == 0, placed.stderr[-3000:]
        lines = placed.stdout.strip().splitlines()
        nodes, alive = json.loads(lines[-2]), json.loads(lines[-1])
        assert alive == 3
        assert len(nodes["RayTrainWorker"]) == 2, nodes
        assert len(nodes["EmbedAndStage"]) == 2, (nodes, run.stdout[-3000:])
        store = LineageStore(f"sqlite:///{tmp_path / 'run' / 'lineage.db'}")
        assert [s.generation for s in store.shards("digits-test")] == ["g0-old"] * 4
        keys = [shard_update_key(StepKind.EMBED, "digits-test", k, "g0-old") for k in range(4)]
        written_on = [store.committed_outputs(key)["node"] for key in keys]
        writers = {node.split(":")[1] for node in written_on}
        assert len(writers) >= 2, (written_on, nodes.get("Finisher"))  # the shards were written on several nodes, not by the driver alone
        store.close()
    finally:
        down = subprocess.run(["bash", str(SCRIPT), "down"], env=script_env, capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
    assert not state.exists()
    state.parent.rmdir()
