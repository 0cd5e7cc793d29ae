"""The embedded pipeline with every file on S3: a real S3 API (moto's server on loopback), the
orchestrator CLI in a subprocess, credentials and endpoint from the usual AWS environment.

Checkpoints, Ray Train's per-epoch checkpoints, gallery shards, FAISS indexes, plans and reports
must all land in the bucket; only the SQLite lineage (which cannot live on object storage) is
local. Every shard the lineage points at is read back from S3 and checked."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import s3fs
import yaml

from orchestrator.data import load_digits
from orchestrator.gallery import read_shard
from orchestrator.index import ShardIndex
from orchestrator.lineage import LineageStore
from orchestrator.storage import load_generation

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def two_generation_pipeline(tmp_path: Path) -> Path:
    """pipelines/lifelong.yaml cut to its first update (g0-old → g1 with a partial backfill)."""
    config = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    config["generations"] = [g for g in config["generations"] if g["name"] in ("g0-old", "g1")]
    config["data"]["scenario"] = "extended_class"
    config["evaluation"] = {"reference": None, "backfill_curves": True}
    for generation in config["generations"]:
        generation["training"] = {**generation["training"], "epochs": 1}
        generation["gate"] = {"action": "force"}  # 1 epoch may fail the gate: not what this test checks
    config["lineage"] = f"sqlite:///{tmp_path / 'lineage.db'}"
    path = tmp_path / "lifelong_s3.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_the_embedded_pipeline_runs_on_s3(s3_bucket, tmp_path):
    bucket, endpoint = s3_bucket
    storage = f"s3://{bucket}/runs/lifelong"
    pipeline = two_generation_pipeline(tmp_path)
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}  # credentials: the fixture's environment
    run = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(pipeline), "--storage", storage],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "testing" not in run.stdout + run.stderr  # the secret key is never printed
    # training progress reaches the driver from Ray Train's workers, whatever the storage
    for name in ("g0-old", "g1"):
        assert re.search(rf"train:{name}: epoch 1/1  loss \d+\.\d{{4}} \(.+\)  lr ", run.stdout), run.stdout[-3000:]
    assert re.search(r"digits-test: embedded \d+/\d+ items \(100%", run.stdout), run.stdout[-3000:]

    os.environ["AWS_ENDPOINT_URL"] = endpoint  # for this process's reads below (monkeypatch restores)
    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    names = {p.removeprefix(f"{bucket}/runs/lifelong/") for p in fs.find(f"{bucket}/runs/lifelong")}
    assert {"generations/g0-old/model.safetensors", "generations/g1/card.json", "reports/compatibility.json",
            "reports/gallery-digits-test.csv", "reports/backfill-digits-test-g1.png",
            "galleries/digits-test/plans/g1.json"} <= names
    assert any(n.startswith("ray/train-g1-") and "checkpoint_" in n for n in names)  # Ray Train's own storage
    assert not any(n.startswith("/") or ".tmp-" in n for n in names)

    store = LineageStore(f"sqlite:///{tmp_path / 'lineage.db'}")
    g1 = store.get_generation("g1")
    assert g1.checkpoint_uri == f"{storage}/generations/g1"
    load_generation(g1.checkpoint_uri, expected_sha256=g1.sha256)
    ids = []
    for shard in store.shards("digits-test"):
        assert shard.embeddings_uri.startswith(f"{storage}/galleries/digits-test/shard-")
        data = read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)
        assert ShardIndex.load(shard.index_uri).ntotal == len(data) == shard.n_items
        ids.append(data.ids)
    assert [s.generation for s in store.shards("digits-test")] == ["g0-old"] * 4 + ["g1"] * 4
    every = np.concatenate(ids)
    assert np.array_equal(np.sort(every), np.sort(load_digits("test").ids))
    assert store.current_deployment().generation == "g1"
    store.close()
