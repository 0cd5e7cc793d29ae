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
- ``serve, switching``: the same load while ``--commits`` shard updates commit (each shard
  rewritten without one queried item, as a backfill commits a shard; each is a new snapshot the
  server builds and swaps in): failed requests; responses mixing snapshots (from a snapshot the
  lineage never held, or returning a queried item the response's snapshot no longer holds); p99 against
  the steady one. The e2e test (tests/pipeline/test_serve_live.py) runs a real deployment and
  rollback under load; here every switch is a shard commit (the same rebuild and swap).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

K = 10


@dataclasses.dataclass
class Load:
    """Latencies (s) of the answered requests, failures, and the wall time they took."""

    latencies: list[float]
    failed: int
    seconds: float
    mixed: int = 0
    snapshots: set[str] = dataclasses.field(default_factory=set)

    def row(self, name: str, n: int, kind: str) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        return {"items": n, "kind": kind, "measure": name, "qps": len(ordered) / self.seconds,
                "p50_ms": 1000 * ordered[len(ordered) // 2], "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
                "requests": len(ordered), "failed": self.failed, "mixed": self.mixed, "snapshots": len(self.snapshots)}


def synthetic_gallery(store, storage: str, gallery: str, n: int, shards: int, kind: str, noise: float,
                      rng: np.random.Generator) -> np.ndarray:
    """Replace ``gallery``'s shards by ``n`` synthetic items of the deployed generation's space
    (module docstring); returns the (n, D) float32 embeddings (row = item id)."""
    from orchestrator.gallery import read_shard
    from orchestrator.lineage.records import ShardAssignment

    current = [s for s in store.shards(gallery) if s.n_items]
    real = [read_shard(s.embeddings_uri, expected_sha256=s.sha256) for s in current]
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
        assignments.append(ShardAssignment(index, template.generation, *written))
    assignments += [ShardAssignment(s.index, template.generation, None, None, None, 0)
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
                load.latencies.append(time.perf_counter() - begin)
                load.snapshots.add(answer["snapshot"])
                if check is not None and not check(query, answer):
                    load.mixed += 1
            sent += concurrency

    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(client(session, n) for n in range(concurrency)))
    load.seconds = time.perf_counter() - started
    return load


def run_size(pipeline: str, n: int, kind: str, args, scratch: Path) -> list[dict[str, Any]]:
    from orchestrator.config import load_pipeline
    from orchestrator.lineage import LineageStore
    from orchestrator.serving.app import start_server
    from orchestrator.serving.endpoint import GalleryEndpoint, ServeSettings
    from orchestrator.serving.snapshots import read_state
    from orchestrator.pipeline.runner import storage_root

    source = storage_root(load_pipeline(pipeline).storage)
    storage = scratch / f"{n}-{kind}"
    shutil.copytree(source, storage, ignore=shutil.ignore_patterns("serving"))
    config = load_pipeline(pipeline, {"storage": str(storage)})
    store = LineageStore(config.lineage, storage=config.storage)
    gallery = config.gallery.name
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    embeddings = synthetic_gallery(store, str(storage), gallery, n, args.shards, kind, args.noise, rng)
    print(f"{n} items, {kind}: gallery written in {time.perf_counter() - started:.0f} s", flush=True)
    queried = rng.choice(n, size=args.queries, replace=False)
    queries = embeddings[queried]
    settings = ServeSettings(config, poll_s=1.0)

    local = GalleryEndpoint(dataclasses.replace(settings, lease=False, poll_s=3600), "serve-load-router")
    rows = [measure_router(local.holder.current.service(), queries, args.seconds).row("router (one process)", n, kind)]
    local.close()

    url = start_server(settings, port=args.port, replicas=args.replicas)
    asyncio.run(closed_loop(url, queries, min(5.0, args.seconds), args.concurrency))  # warm-up
    rows.append(asyncio.run(closed_loop(url, queries, args.seconds, args.concurrency)).row("serve", n, kind))

    removed: dict[str, set[int]] = {read_state(store, gallery).snapshot_id: set()}

    def consistent(query: int, answer: dict) -> bool:
        """False when the response's snapshot is none the lineage held, or it returns an item
        that snapshot no longer holds (an approximate index may miss a held one: not counted)."""
        gone = removed.get(answer["snapshot"])
        return gone is not None and not (int(queried[query]) in gone and
                                         int(queried[query]) in {hit["id"] for hit in answer["results"][0]})

    async def switching() -> Load:
        load = asyncio.create_task(closed_loop(url, queries, args.seconds, args.concurrency, consistent))
        gone: set[int] = set()
        for commit in range(args.commits):
            await asyncio.sleep(args.seconds / (args.commits + 1))
            item = int(queried[commit % len(queried)])
            number = int(np.searchsorted(_starts(n, args.shards), item, side="right") - 1)
            shard = next(s for s in store.shards(gallery) if s.index == number)
            await asyncio.to_thread(_rewrite_without, store, str(storage), gallery, shard, item, kind)
            gone.add(item)
            removed[read_state(store, gallery).snapshot_id] = set(gone)
        return await load

    rows.append(asyncio.run(switching()).row(f"serve, {args.commits} shard commits", n, kind))
    from ray import serve

    serve.delete("orchestrator")
    store.close()
    shutil.rmtree(storage)
    return rows


def _starts(n: int, shards: int) -> np.ndarray:
    return np.array([rows[0] for rows in np.array_split(np.arange(n), shards)])


def _rewrite_without(store, storage: str, gallery: str, shard, item: int, kind: str) -> None:
    """What a backfill commits for one shard: its file and index rewritten (here without ``item``)."""
    from orchestrator.gallery import read_shard
    from orchestrator.lineage.records import ShardAssignment

    stored = read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)
    kept = stored.without(np.array([item]))
    written = _write(store, storage, gallery, shard.index, kept, kept.ids, kept.embeddings, kind)
    store.assign_shards(gallery, [ShardAssignment(shard.index, kept.generation, *written)])


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
    parser.add_argument("--replicas", type=int, default=1)
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
    print("\nsteady p99 vs p99 while switching: " + ", ".join(
        f"{a['items']:,} {a['kind']}: {b['p99_ms'] / a['p99_ms']:.2f}x"
        for a, b in zip(rows[1::3], rows[2::3])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
