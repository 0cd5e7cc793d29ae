"""Load on ``orchestrator serve`` against the same searches through the router in one process.

    python benchmarks/serve_load.py PIPELINE --items 1e5 1e6 --kinds flat hnsw
    python benchmarks/serve_load.py PIPELINE --items 2000 --seconds 5      # a smoke run

PIPELINE: a pipeline file whose run has finished (its storage holds the deployed generation; e.g.
the g0-old run of tests/pipeline/g0_run.py). Per gallery size N and index kind, the run's storage
is copied to a scratch folder and its gallery's shards are replaced by N items (``--shards``
shards) embedded in the deployed generation's space: points of its hyperboloid whose space part is
a real stored embedding's plus Gaussian noise (std ``--noise`` times the real ones' std per
coordinate), each shard written, indexed (``kind``) and hashed into the lineage as the pipeline
writes one. Queries: the embeddings of ``--queries`` gallery items (so each finds itself first),
one query per request, ``k = 10``.

Three measurements, one after the other in one run:

- ``router``: ``search.service.search_answer`` (the code behind ``orchestrator search`` and the
  server) called in this process, one query after another: queries/s, p50, p99;
- ``serve``: ``--concurrency`` clients (asyncio, aiohttp), each sending its next request when the
  previous one is answered (a closed loop), for ``--seconds`` against a server with ``--replicas``
  replicas on a local Ray, on 127.0.0.1 only: queries/s, p50, p99, failed requests;
- ``serve, switching``: the same load while the lineage switches, in this order: ``--commits``
  shard updates commit (each shard rewritten without one queried item, as a backfill commits a
  shard), a new generation deploys (with a full backfill's shards: the gallery relabelled to it in
  the deployment's transaction), and ``orchestrator deploy --rollback`` (``operations.redeploy``)
  serves the first generation again with the shards its deployment recorded. Each is a new
  snapshot the server builds and swaps in. Failed requests; responses mixing snapshots (from a
  snapshot the lineage never held, or whose serving generation, hit generations or hit items are
  not that snapshot's: a hit of an item the snapshot no longer holds, or outside its shard); p99
  over the whole window and over the requests in flight while a switch was being built and
  swapped in (from its commit until the first response from its snapshot), against the steady one.

The two generations are twins of the run's deployed one (``twin_generation``: the same checkpoint
and card under another name), so the deploy loads a model the encoder does not hold under that
name, and the gallery's items and distances stay comparable across the switches. The server runs
with ``--replicas`` ingress replicas, an encoder replica and ``--search-replicas`` shard-search
replicas (0: every ingress replica searches in its own process), ``--replica-cpus`` CPUs each.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: one thread per process for BLAS and FAISS, before numpy and faiss load
    for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")

import numpy as np

from orchestrator.lineage.step_keys import deploy_key, train_key

K = 10


@dataclasses.dataclass
class Load:
    """Latencies (s) of the answered requests, failures, and the wall time they took."""

    latencies: list[float]
    failed: int
    seconds: float
    mixed: int = 0
    snapshots: set[str] = dataclasses.field(default_factory=set)
    answered: list[tuple[float, float, str]] = dataclasses.field(default_factory=list)
    """(start, end, snapshot) of each answered request, perf_counter seconds."""

    def during(self, windows: list[tuple[float, float]]) -> "Load":
        """The answered requests in flight during any of ``windows`` (start, end)."""
        picked = [(a, b) for a, b, _snapshot in self.answered if any(a < end and b > start for start, end in windows)]
        return Load([b - a for a, b in picked], 0, sum(end - start for start, end in windows))

    def row(self, name: str, n: int, kind: str) -> dict[str, Any]:
        ordered = sorted(self.latencies) or [float("nan")]
        return {"items": n, "kind": kind, "measure": name, "qps": len(ordered) / self.seconds,
                "p50_ms": 1000 * ordered[len(ordered) // 2], "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
                "requests": len(self.latencies), "failed": self.failed, "mixed": self.mixed, "snapshots": len(self.snapshots)}


def synthetic_gallery(store, storage: str, gallery: str, n: int, shards: int, kind: str, noise: float,
                      rng: np.random.Generator, generation: str) -> np.ndarray:
    """Replace ``gallery``'s shards by ``n`` synthetic items of the deployed generation's space
    (module docstring), rows of ``generation``; returns the (n, D) float32 embeddings (row = item id)."""
    from orchestrator.gallery import read_recorded_shard
    from orchestrator.lineage.records import ShardAssignment

    current = [s for s in store.shards(gallery) if s.n_items]
    real = [read_recorded_shard(s) for s in current]
    template = real[0]
    if template.space != "lorentz":
        raise ValueError(f"serve_load generates hyperboloid points; the deployed generation embeds in {template.space}")
    space_part = np.concatenate([r.embeddings[:, 1:] for r in real]).astype(np.float64)
    spread = space_part.std(axis=0) * noise
    points = space_part[rng.integers(0, len(space_part), n)] + rng.normal(size=(n, space_part.shape[1])) * spread
    time_part = np.sqrt(1.0 / template.curv + (points ** 2).sum(axis=1, keepdims=True))
    embeddings = np.concatenate([time_part, points], axis=1).astype(np.float32)
    assignments = []
    for index, rows in enumerate(np.array_split(np.arange(n), shards)):
        written = _write(store, storage, gallery, index, template, rows.astype(np.int64), embeddings[rows], kind)
        assignments.append(ShardAssignment(index, generation, *written))
    assignments += [ShardAssignment(s.index, generation, None, None, None, 0)
                    for s in store.shards(gallery) if s.index >= shards]
    store.assign_shards(gallery, assignments, grow=True)
    return embeddings


def _write(store, storage: str, gallery: str, index: int, template, ids: np.ndarray, embeddings: np.ndarray,
           kind: str) -> tuple[str, str, str, int]:
    """Write shard ``index`` holding items ``ids`` (n,) with ``embeddings`` (n, D): its file, index
    and the index's hashes in the lineage, as the pipeline writes a shard; (uri, index uri, sha256, n)."""
    import pyarrow as pa

    from orchestrator.integrity import record_index
    from orchestrator.shard_update import ShardTarget, write_shard_files
    from orchestrator.storage import join_uri

    shard = dataclasses.replace(template, ids=ids, labels=np.zeros(len(ids), np.int64), embeddings=embeddings,
                                uncertainty=np.zeros(len(ids), np.float32), rows=ids,
                                attributes=pa.table({"uri": [f"synthetic#{i}" for i in ids]}))
    written = write_shard_files(index, shard, ShardTarget(join_uri(storage, "galleries", gallery), kind), "bench", True)
    record_index(store, written.index_uri, written.index_record)
    return written.embeddings_uri, written.index_uri, written.sha256, len(ids)


def measure_router(service, queries: np.ndarray, seconds: float) -> Load:
    """One query after another through ``search_answer`` in this process, for ``seconds``."""
    from orchestrator.search.service import search_answer

    latencies, started = [], time.perf_counter()
    while time.perf_counter() - started < seconds:
        query = queries[len(latencies) % len(queries)][None]
        begin = time.perf_counter()
        search_answer(service, query, K)
        latencies.append(time.perf_counter() - begin)
    return Load(latencies, 0, time.perf_counter() - started)  # no snapshots: the router is fixed


async def closed_loop(url: str, queries: np.ndarray, seconds: float, concurrency: int,
                      check=None) -> Load:
    """``concurrency`` clients, each sending its next one-query request when the last is answered."""
    import aiohttp

    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"serve_load only loads a server on 127.0.0.1, got {url}")
    load = Load([], 0, 0.0)
    bodies = [json.dumps({"embeddings": [q.tolist()], "k": K}) for q in queries]
    deadline = time.perf_counter() + seconds

    async def client(session, number: int) -> None:
        sent = number
        while time.perf_counter() < deadline:
            query = sent % len(queries)
            begin = time.perf_counter()
            try:
                async with session.post(f"{url}/search", data=bodies[query],
                                        headers={"Content-Type": "application/json"}) as response:
                    answer = await response.json()
                    ok = response.status == 200
            except aiohttp.ClientError:
                ok = False
            if not ok:
                load.failed += 1
            else:
                end = time.perf_counter()
                load.latencies.append(end - begin)
                load.answered.append((begin, end, answer["snapshot"]))
                load.snapshots.add(answer["snapshot"])
                if check is not None and not check(query, answer):
                    load.mixed += 1
            sent += concurrency

    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(client(session, n) for n in range(concurrency)))
    load.seconds = time.perf_counter() - started
    return load


def twin_generation(store, source: str, name: str) -> None:
    """Record generation ``name``: ``source``'s definition, checkpoint and card hash under another
    name (the same model, so the gallery's embeddings are its own)."""
    record = store.get_generation(source)
    store.upsert_generation(name, parent=record.parent, method=record.method, params=record.params, arch=record.arch,
                            space=record.space, curv=record.curv)
    store.mark_generation_trained(name, record.checkpoint_uri, record.sha256, step=train_key(name),
                                  step_outputs=store.committed_outputs(train_key(source)))


def deploy_with_shards(store, gallery: str, generation: str) -> None:
    """Deploy ``generation`` with the gallery's current shards relabelled to it, in one
    transaction (a full backfill's shards and its deployment), recording them as
    ``deploy:<generation>`` as the pipeline does."""
    from orchestrator.lineage.records import ShardAssignment
    from orchestrator.pipeline.operations import SNAPSHOT_FIELDS, shard_snapshot

    rows = [{**row, "generation": generation} for row in shard_snapshot(store.shards(gallery)) if row["n_items"]]
    store.deploy(generation, step=deploy_key(generation), step_outputs={"generation": generation, "shards": rows},
                 restore=(gallery, [ShardAssignment(**{name: row[name] for name in SNAPSHOT_FIELDS}) for row in rows]))


@dataclasses.dataclass(frozen=True)
class Served:
    """What a snapshot serves, for the consistency check: its serving generation, its shards'
    generation, and the items removed from the gallery."""

    serving: str
    generation: str
    removed: frozenset[int]


def consistent(answer: dict, served: dict[str, Served], starts: np.ndarray, n: int) -> bool:
    """True when ``answer`` is wholly from a snapshot the lineage held: known id, its serving
    generation, and every hit an item that snapshot holds, in its shard, of its generation."""
    snapshot = served.get(answer["snapshot"])
    if snapshot is None or answer["serving"] != snapshot.serving:
        return False
    for hits in answer["results"]:
        for hit in hits:
            item = hit["id"]
            shard = int(np.searchsorted(starts, item, side="right") - 1)
            if (not 0 <= item < n or item in snapshot.removed or hit["shard"] != shard
                    or hit["generation"] != snapshot.generation):
                return False
    return True


def run_size(pipeline: str, n: int, kind: str, args, scratch: Path) -> list[dict[str, Any]]:
    from orchestrator.config import load_pipeline
    from orchestrator.lineage import LineageStore
    from orchestrator.pipeline.operations import redeploy
    from orchestrator.pipeline.runner import storage_root
    from orchestrator.serving.app import start_server
    from orchestrator.serving.endpoint import GalleryEndpoint
    from orchestrator.serving.settings import Pools, ServeSettings
    from orchestrator.serving.snapshots import read_state

    source = storage_root(load_pipeline(pipeline).storage)
    storage = scratch / f"{n}-{kind}"
    shutil.copytree(source, storage, ignore=shutil.ignore_patterns("serving"))
    config = load_pipeline(pipeline, {"storage": str(storage)})
    store = LineageStore(config.lineage, storage=config.storage)
    gallery = config.gallery.name
    deployed = store.current_deployment().generation
    first, second = "bench-a", "bench-b"
    for twin in (first, second):
        twin_generation(store, deployed, twin)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    embeddings = synthetic_gallery(store, str(storage), gallery, n, args.shards, kind, args.noise, rng, first)
    deploy_with_shards(store, gallery, first)
    print(f"{n} items, {kind}: gallery written in {time.perf_counter() - started:.0f} s", flush=True)
    queried = rng.choice(n, size=args.queries, replace=False)
    queries = embeddings[queried]
    settings = ServeSettings(config, poll_s=1.0)

    local = GalleryEndpoint(dataclasses.replace(settings, lease=False, poll_s=3600), "serve-load-router")
    rows = [measure_router(local.holder.current.service(), queries, args.seconds).row("router (one process)", n, kind)]
    local.close()

    pools = Pools(args.replicas, 1, args.search_replicas, args.replica_cpus)
    url = start_server(settings, port=args.port, pools=pools)
    asyncio.run(closed_loop(url, queries, min(5.0, args.seconds), args.concurrency))  # warm-up
    rows.append(asyncio.run(closed_loop(url, queries, args.seconds, args.concurrency)).row("serve", n, kind))

    starts = _starts(n, args.shards)
    served = {read_state(store, gallery).snapshot_id: Served(first, first, frozenset())}
    switches: list[tuple[float, str]] = []  # (when committed, the snapshot it makes)

    def switch(change, serving: str, generation: str, removed: frozenset[int]) -> None:
        began = time.perf_counter()
        change()
        state = read_state(store, gallery)
        served[state.snapshot_id] = Served(serving, generation, removed)
        switches.append((began, state.snapshot_id))

    async def switching() -> Load:
        load = asyncio.create_task(closed_loop(url, queries, args.seconds, args.concurrency,
                                               lambda _query, answer: consistent(answer, served, starts, n)))
        gone: set[int] = set()
        steps = args.commits + 2
        for commit in range(args.commits):
            await asyncio.sleep(args.seconds / (steps + 1))
            item = int(queried[commit % len(queried)])
            number = int(np.searchsorted(starts, item, side="right") - 1)
            shard = next(s for s in store.shards(gallery) if s.index == number)
            gone.add(item)
            await asyncio.to_thread(switch, lambda: _rewrite_without(store, str(storage), gallery, shard, item, kind),
                                    first, first, frozenset(gone))
        await asyncio.sleep(args.seconds / (steps + 1))
        await asyncio.to_thread(switch, lambda: deploy_with_shards(store, gallery, second), second, second,
                                frozenset(gone))
        await asyncio.sleep(args.seconds / (steps + 1))
        # the rollback serves the first generation with the shards its deployment recorded: the
        # gallery before the commits
        await asyncio.to_thread(switch, lambda: redeploy(store, gallery, None, True, lambda _line: None), first, first,
                                frozenset())
        return await load

    during = asyncio.run(switching())
    name = f"serve, {args.commits} shard commits + deploy + rollback"
    rows.append(during.row(name, n, kind))
    windows = []
    for began, snapshot in switches:
        seen = [end for _start, end, answered in during.answered if answered == snapshot and end > began]
        windows.append((began, min(seen) if seen else during.answered[-1][1]))
    rows.append(during.during(windows).row(f"{name}: requests in flight during a switch", n, kind))
    rows[-1].update(failed=during.failed, mixed=during.mixed, snapshots=len(during.snapshots),
                    switches=len(switches), served_switches=sum(1 for _b, s in switches if s in during.snapshots))
    from ray import serve

    serve.delete("orchestrator")
    store.close()
    shutil.rmtree(storage)
    return rows


def _starts(n: int, shards: int) -> np.ndarray:
    return np.array([rows[0] for rows in np.array_split(np.arange(n), shards)])


def _rewrite_without(store, storage: str, gallery: str, shard, item: int, kind: str) -> None:
    """What a backfill commits for one shard: its file and index rewritten (here without ``item``)."""
    from orchestrator.gallery import read_recorded_shard
    from orchestrator.lineage.records import ShardAssignment

    stored = read_recorded_shard(shard)
    kept = stored.without(np.array([item]))
    written = _write(store, storage, gallery, shard.index, kept, kept.ids, kept.embeddings, kind)
    store.assign_shards(gallery, [ShardAssignment(shard.index, shard.generation, *written)])


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| items | index | measured | queries/s | p50 ms | p99 ms | requests | failed | mixed | snapshots |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['items']:,} | {r['kind']} | {r['measure']} | {r['qps']:.0f} | {r['p50_ms']:.1f} | "
              f"{r['p99_ms']:.1f} | {r['requests']} | {r['failed']} | {r['mixed']} | {r['snapshots'] or '-'} |"
              for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline", help="pipeline file of a finished run")
    parser.add_argument("--items", nargs="+", type=lambda v: int(float(v)), default=[100_000, 1_000_000])
    parser.add_argument("--kinds", nargs="+", default=["flat", "hnsw"])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=1, help="ingress replicas")
    parser.add_argument("--search-replicas", type=int, default=2, help="shard-search replicas (0: one process)")
    parser.add_argument("--replica-cpus", type=float, default=0.5, help="CPUs of each encoder and search replica")
    parser.add_argument("--commits", type=int, default=4)
    parser.add_argument("--noise", type=float, default=0.25)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)

    from orchestrator.distributed.runtime import start_local_ray

    start_local_ray(num_cpus=2)
    rows = []
    with tempfile.TemporaryDirectory(prefix="serve-load-") as scratch:
        for n in args.items:
            for kind in args.kinds:
                rows += run_size(args.pipeline, n, kind, args, Path(scratch))
                print(table(rows), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    print("\np99 while switching / steady p99: " + ", ".join(
        f"{steady['items']:,} {steady['kind']}: whole window {whole['p99_ms'] / steady['p99_ms']:.2f}x, "
        f"in flight during a switch {during['p99_ms'] / steady['p99_ms']:.2f}x"
        for steady, whole, during in zip(rows[1::4], rows[2::4], rows[3::4])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
