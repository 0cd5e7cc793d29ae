"""The CLI with everything remote, as on a cluster: storage on S3 (moto's server on loopback) and the
lineage on a real PostgreSQL server (``postgresql+psycopg://``, given with ``--lineage``).

Two `orchestrator run` of the same pipeline start at once: one runs, the other stops at once with
exit 4 naming the first. The run prints every epoch and the embedding count (progress reaches the
driver whatever the storage), never the secret key, and writes checkpoints, Ray Train's own
checkpoints, plans, shards and reports to S3, every item in exactly one shard. Every step is then
committed exactly once; a third run resumes and skips them all; `orchestrator lineage` and
`orchestrator search` read the PostgreSQL lineage."""
from __future__ import annotations

import json
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
from orchestrator.lineage import LineageStore

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def tiny_pipeline(tmp_path: Path) -> Path:
    """g0-old → g1 of pipelines/lifelong.yaml, one epoch each, no reference, backfill curves, g1's
    gate forced."""
    config = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    config["name"] = "remote-tiny"
    config["generations"] = [g for g in config["generations"] if g["name"] in ("g0-old", "g1")]
    config["data"]["scenario"] = "extended_class"
    config["evaluation"] = {"reference": None, "backfill_curves": True}
    for generation in config["generations"]:
        generation["training"] = {**generation["training"], "epochs": 1}
    config["generations"][1]["gate"] = {"action": "force"}  # one epoch may not pass the criterion
    path = tmp_path / "remote_tiny.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def orchestrator(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, timeout: float = 900) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def step_keys(store: LineageStore) -> set[str]:
    from orchestrator.lineage import lineage_json

    return {step["key"] for step in lineage_json(store)["steps"]}


def assert_stored_on_s3(bucket: str, endpoint: str, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # for this process's reads
    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    root = f"{bucket}/runs/remote"
    names = {p.removeprefix(f"{root}/") for p in fs.find(root)}
    assert {"generations/g0-old/model.safetensors", "generations/g1/card.json", "reports/compatibility.json",
            "reports/gallery-digits-test.csv", "reports/backfill-digits-test-g1.png",
            "galleries/digits-test/plans/g1.json"} <= names
    assert any(n.startswith("ray/train-g1-") and "checkpoint_" in n for n in names)  # Ray Train's own storage
    assert not any(n.startswith("/") or ".tmp-" in n for n in names)


def assert_every_item_in_one_shard(store: LineageStore, bucket: str) -> None:
    ids = []
    for shard in store.shards("digits-test"):
        assert shard.embeddings_uri.startswith(f"s3://{bucket}/runs/remote/galleries/digits-test/shard-")
        data = read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)
        assert len(data) == shard.n_items
        ids.append(data.ids)
    assert [s.generation for s in store.shards("digits-test")] == ["g0-old"] * 4 + ["g1"] * 4
    assert np.array_equal(np.sort(np.concatenate(ids)), np.sort(load_digits("test").ids))


def test_two_runs_at_once_resume_search_and_lineage_on_s3_with_postgresql(s3_bucket, postgres_url, tmp_path,
                                                                           monkeypatch):
    bucket, endpoint = s3_bucket
    pipeline = tiny_pipeline(tmp_path)
    location = ["--storage", f"s3://{bucket}/runs/remote", "--lineage", postgres_url]
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}

    first, second = (orchestrator("run", str(pipeline), *location, cwd=tmp_path, env=env) for _ in range(2))
    results = {process.pid: finish(process) for process in (first, second)}
    codes = sorted(code for code, _out, _err in results.values())
    assert codes == [0, 4], {pid: (c, o[-2000:], e[-2000:]) for pid, (c, o, e) in results.items()}
    winner = next(pid for pid, (code, _o, _e) in results.items() if code == 0)
    busy = next(err for code, _o, err in results.values() if code == 4)
    assert busy.startswith("orchestrator: busy: pipeline 'remote-tiny' is held by ") and busy.count("\n") == 1
    assert f"(pid {winner}, orchestrator run)" in busy
    out = results[winner][1]
    assert "testing" not in out + results[winner][2]  # the fixture's secret key is never printed
    for name in ("g0-old", "g1"):
        assert re.search(rf"train:{name}: epoch 1/1  loss \d+\.\d{{4}} \(.+\)  lr ", out), out[-3000:]
    assert re.search(r"digits-test: embedded \d+/\d+ items \(100%", out), out[-3000:]
    assert_stored_on_s3(bucket, endpoint, monkeypatch)

    store = LineageStore(postgres_url, readonly=True)
    steps = {key: store.get_step(key) for key in
             ("train:g0-old", "evaluate:g0-old", "deploy:g0-old", "train:g1", "evaluate:g1", "deploy:g1")}
    assert all(s is not None and (s.status, s.attempts) == ("committed", 1) for s in steps.values()), steps
    assert [r.invocations for r in store.runs()] == [1]  # the refused run registered nothing
    assert store.get_generation("g1").checkpoint_uri == f"s3://{bucket}/runs/remote/generations/g1"
    assert store.current_deployment().generation == "g1"
    assert_every_item_in_one_shard(store, bucket)
    counts, keys = store.row_counts(), step_keys(store)

    code, out, err = finish(orchestrator("run", str(pipeline), *location, cwd=tmp_path, env=env))
    assert code == 0, out[-2000:] + err[-2000:]
    assert all(f"{key}: already committed, skipped" in out for key in steps)
    assert step_keys(store) == keys  # no step of a finished run runs again (nor a gate of an older generation)
    assert store.row_counts() == counts and [r.invocations for r in store.runs()] == [2]

    code, out, err = finish(orchestrator("lineage", "--lineage", postgres_url, "--json", cwd=tmp_path, env=env))
    assert code == 0, err
    document = json.loads(out)
    assert {g["name"]: g["status"] for g in document["generations"]} == {"g0-old": "trained", "g1": "trained"}

    code, out, err = finish(orchestrator("search", str(pipeline), *location, "--split", "test", "--limit", "3",
                                         "-k", "3", "--skip-incompatible", "--json", cwd=tmp_path, env=env))
    assert code == 0, err[-2000:]
    report = json.loads(out)
    assert report["serving"] == "g1" and len(report["results"]) == 3
    assert all(len(hits) == 3 for hits in report["results"])
    assert store.row_counts() == counts  # reading changed nothing
    store.close()
