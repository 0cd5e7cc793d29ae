"""The CLI with everything remote, as on a cluster: storage on S3 (moto's server on loopback), the
gallery an unlabelled set of five Parquet files in the bucket, and the lineage on a real PostgreSQL
server (``postgresql+psycopg://``, given with ``--lineage``).

Two `orchestrator run` of the same pipeline start at once: one runs, the other stops at once with
exit 4 naming the first. The run trains g0-old → g1 on the digits, prints every epoch and the
embedding count (progress reaches the driver whatever the storage), never the secret key, embeds
the gallery straight from the bucket, backfills half of it, skips the served-gallery report for
want of labels (and says so), and writes checkpoints, Ray Train's own checkpoints, plans, shards
and reports to S3: every item in exactly one committed shard with its object key and caption.
Every step is committed exactly once; a third run resumes and skips them all; `orchestrator
lineage` reads the PostgreSQL lineage, and `orchestrator search` with a folder of query images
finds each query's own item first, named by its key and caption."""
from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import s3fs
import yaml
from PIL import Image

from cli_runs import Running, orchestrator_process
from orchestrator.gallery import read_shard
from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import train_key
from streamed_gallery import FILE_SIZES, pipeline_config, write_parquet_gallery

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def remote_pipeline(tmp_path: Path, bucket: str, endpoint: str) -> tuple[Path, dict[int, dict[str, str]]]:
    """g0-old → g1 of pipelines/lifelong.yaml (one epoch each, gates forced) over the Parquet
    gallery uploaded to ``s3://bucket/gallery/``; returns the file and row → {"key", "caption"}."""
    expected = write_parquet_gallery(tmp_path / "gallery")
    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    for part in sorted((tmp_path / "gallery").iterdir()):
        fs.put_file(str(part), f"{bucket}/gallery/{part.name}")
    config = pipeline_config(f"s3://{bucket}/runs/remote", f"s3://{bucket}/gallery/", items_per_shard=100)
    config["name"] = "remote-tiny"
    path = tmp_path / "remote_tiny.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, expected


def orchestrator(*args: str, cwd: Path, env: dict[str, str]) -> Running:
    return orchestrator_process(*args, cwd=cwd, env=env)


def finish(process: Running, timeout: float = 900) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def step_keys(store: LineageStore) -> set[str]:
    from orchestrator.lineage import lineage_json

    return {step["key"] for step in lineage_json(store)["steps"]}


def assert_stored_on_s3(bucket: str, endpoint: str) -> None:
    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    root = f"{bucket}/runs/remote"
    names = {p.removeprefix(f"{root}/") for p in fs.find(root)}
    assert {"generations/g0-old/model.safetensors", "generations/g1/card.json", "reports/compatibility.json",
            "reports/compatibility.csv", "galleries/photos/plans/g1.json"} <= names
    assert any(n.startswith("ray/train-g1-") and "checkpoint_" in n for n in names)  # Ray Train's own storage
    assert not any(n.startswith("/") or ".tmp-" in n for n in names)


def assert_every_item_in_one_shard(store: LineageStore, bucket: str, expected: dict[int, dict[str, str]]) -> list[int]:
    """Every gallery row in exactly one committed shard, with its object key; returns rows in g1's shards."""
    rows, g1_rows = [], []
    for shard in store.shards("photos"):
        assert shard.embeddings_uri.startswith(f"s3://{bucket}/runs/remote/galleries/photos/shard-")
        data = read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)
        assert len(data) == shard.n_items
        assert data.attributes.column("uri").to_pylist() == [expected[int(r)]["key"] for r in data.rows]
        rows.append(data.rows)
        if shard.generation == "g1":
            g1_rows += [int(r) for r in data.rows]
    every = np.concatenate(rows)
    assert np.array_equal(np.sort(every), np.arange(sum(FILE_SIZES)))  # each item in exactly one shard
    assert len(g1_rows) == sum(FILE_SIZES) // 2  # g1 backfilled the planned half
    return g1_rows


def query_folder(tmp_path: Path, rows: list[int]) -> Path:
    """The gallery images of ``rows`` (of the first three Parquet files) as PNG files q0, q1, …"""
    table = [r for n in range(3) for r in pq.read_table(tmp_path / "gallery" / f"part-{n:03d}.parquet").to_pylist()]
    folder = tmp_path / "queries"
    folder.mkdir()
    for number, row in enumerate(rows):
        Image.open(io.BytesIO(table[row]["image"])).save(folder / f"q{number}.png")
    return folder


def test_two_runs_at_once_resume_search_and_lineage_on_s3_with_postgresql(s3_bucket, postgres_url, tmp_path,
                                                                           monkeypatch):
    bucket, endpoint = s3_bucket
    pipeline, expected = remote_pipeline(tmp_path, bucket, endpoint)
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
        assert re.search(re.escape(train_key(name)) + r": epoch 1/1  loss \d+\.\d{4} \(.+\)  lr ", out), out[-3000:]
    assert re.search(r"photos: embedded \d+/\d+ items \(100%", out), out[-3000:]
    assert "no labels" in out  # the served-gallery report is skipped, and says why
    assert_stored_on_s3(bucket, endpoint)

    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # for this process's reads
    store = LineageStore(postgres_url, readonly=True)
    steps = {key: store.get_step(key) for key in
             ("train:g0-old", "evaluate:g0-old", "deploy:g0-old", "train:g1", "evaluate:g1", "deploy:g1")}
    assert all(s is not None and (s.status, s.attempts) == ("committed", 1) for s in steps.values()), steps
    assert [r.invocations for r in store.runs()] == [1]  # the refused run registered nothing
    assert store.get_generation("g1").checkpoint_uri == f"s3://{bucket}/runs/remote/generations/g1"
    assert store.current_deployment().generation == "g1"
    g1_rows = assert_every_item_in_one_shard(store, bucket, expected)
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

    chosen = sorted(r for r in g1_rows if r < sum(FILE_SIZES[:3]))[:3]
    queries = query_folder(tmp_path, chosen)
    code, out, err = finish(orchestrator("search", str(pipeline), *location, "--queries", str(queries), "-k", "3",
                                         "--skip-incompatible", "--json", cwd=tmp_path, env=env))
    assert code == 0, err[-2000:]
    report = json.loads(out)
    assert report["serving"] == "g1" and report["queries"] == [str(queries / f"q{n}.png") for n in range(3)]
    for row, hits in zip(chosen, report["results"], strict=True):
        assert len(hits) == 3
        assert hits[0]["uri"] == expected[row]["key"] and hits[0]["caption"] == expected[row]["caption"]
        assert hits[0]["distance"] == pytest.approx(0.0, abs=1e-3)
    assert store.row_counts() == counts  # reading changed nothing
    store.close()
