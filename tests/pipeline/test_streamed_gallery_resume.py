"""A streamed gallery (five Parquet files, no labels) survives a killed driver: the driver process is
SIGKILLed (with the local Ray it started) while the first generation embeds the shards, and again
while the second one backfills half of the items; after each kill every item is in at most one
committed shard, each shard's file matches the lineage, and the next run does only what is left.
At the end every item is in exactly one shard, with its object key and caption, the second
generation holds exactly the planned half, and ``verify`` finds no problem. The shards are written by
the workers, so the kills also hit files written but never committed, and parts staged for
updates that never finished: ``verify`` lists them, ``gc`` removes them, the run goes on."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from orchestrator.gallery import read_shard
from orchestrator.index import ShardIndex
from orchestrator.lineage import LineageStore
from orchestrator.pipeline.operations import collect_garbage
from orchestrator.pipeline.verify import verify_storage
from streamed_gallery import pipeline_config, write_parquet_gallery

pytestmark = pytest.mark.e2e
DRIVER = Path(__file__).with_name("streamed_gallery.py")


def committed(store_url: str, prefix: str) -> int:
    store = LineageStore(store_url)
    try:
        return sum(1 for s in store.steps() if s.key.startswith(prefix) and s.status == "committed")
    finally:
        store.close()


def run_driver(config_file: Path, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DRIVER.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(DRIVER), str(config_file)], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def kill_when(process: subprocess.Popen, condition, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"the driver ended before {what}:\n{process.stdout.read()[-3000:]}")
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    process.stdout.close()


def gallery_state(store_url: str) -> dict[str, np.ndarray]:
    """Generation → the rows its committed shards hold; asserts every shard matches the lineage and
    no row is in two shards."""
    store = LineageStore(store_url)
    try:
        rows, held = [], {}
        for shard in store.shards("photos"):
            if shard.generation is None:
                continue
            data = read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)
            assert (data.generation, len(data)) == (shard.generation, shard.n_items)
            assert ShardIndex.load(shard.index_uri).ntotal == shard.n_items
            rows.append(data.rows)
            held[shard.generation] = np.concatenate([held.get(shard.generation, np.zeros(0, np.int64)), data.rows])
        every = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        assert np.unique(every).size == every.size, "an item is in two committed shards"
        return held
    finally:
        store.close()


def test_a_killed_streamed_backfill_resumes_without_loss_or_duplicates(tmp_path):
    expected = write_parquet_gallery(tmp_path / "gallery")
    config = pipeline_config(str(tmp_path / "run"), str(tmp_path / "gallery"), items_per_shard=30, batch_size=16)
    store_url = f"sqlite:///{tmp_path / 'run' / 'lineage.db'}"
    config["lineage"] = store_url
    (tmp_path / "run").mkdir()
    config_file = tmp_path / "pipeline.json"
    config_file.write_text(json.dumps(config))

    first = run_driver(config_file, tmp_path)
    kill_when(first, lambda: committed(store_url, "embed:photos/") >= 3, "three shards of g0-old committed")
    after_kill = gallery_state(store_url)
    assert 0 < after_kill["g0-old"].size < 539  # killed part-way: some shards done, none half-done

    second = run_driver(config_file, tmp_path)
    kill_when(second, lambda: committed(store_url, "split:photos/") >= 2, "two splits of g1 committed")
    gallery_state(store_url)
    # what the killed updates staged is listed by verify, never served, and removed by gc
    store = LineageStore(store_url)
    staged = [p for p in verify_storage(store, str(tmp_path / "run")).unreferenced if "/staging/" in p]
    assert staged
    collected = collect_garbage(store, str(tmp_path / "run"), "photos", keep_deployments=1, dry_run=False)
    assert set(staged) <= set(collected.removed)
    assert not [p for p in verify_storage(store, str(tmp_path / "run")).unreferenced if "/staging/" in p]
    store.close()

    final = run_driver(config_file, tmp_path)
    output, _ = final.communicate(timeout=600)
    assert final.returncode == 0, output[-3000:]
    assert "already committed, skipped" in output
    held = gallery_state(store_url)
    assert np.array_equal(np.sort(np.concatenate(list(held.values()))), np.arange(539))  # every item, once
    assert held["g1"].size == 269  # ⌊0.5 · 539⌋ items re-embedded into new shards

    store = LineageStore(store_url)
    for shard in store.shards("photos"):
        data = read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)
        attributes = data.attributes.to_pydict()
        assert attributes["uri"] == [expected[int(r)]["key"] for r in data.rows]
        assert attributes["caption"] == [expected[int(r)]["caption"] for r in data.rows]
        assert (data.labels == -1).all()  # an unlabelled gallery
    keys = [s.key for s in store.steps()]
    assert len(keys) == len(set(keys))
    verified = verify_storage(store, str(tmp_path / "run"))  # what `orchestrator verify` checks
    assert verified.ok and verified.checked >= len(store.shards("photos")), verified.lines()
    store.close()
