"""Search speed, memory and quality of every index kind, as ratios to float Euclidean flat search.

    python benchmarks/search.py                       # 10^5 and 10^6 items, then quality on the digits
    python benchmarks/search.py --sizes 1e5 --json runs/bench/search.json
    python benchmarks/search.py --quick               # 2,000 items, 1-epoch model: a smoke run

Speed and memory (per gallery size N, generated data): N points of the Poincaré ball of curvature
0.1 (the paper's c), 128-d (``--dim``): ``exp_0`` of Gaussian tangent vectors (std 0.1 per
coordinate), float32; queries drawn the same way. Every method is built over the same points and
searched for the ``k = 50`` nearest items (the paper's cutoff) in two regimes, side by side in the
same run (``--repeat R`` times each, every timing of a method right after one of the baseline, so
that each speed ratio compares two measurements seconds apart; rates and ratios are medians):

  single   ``--single`` calls (default 200) with ONE query each: serving, one request at a time;
  batched  one call with ``--batch`` queries (default 1000): BLAS-batched float search.

Methods (rows):

  euclidean_flat      ``faiss.IndexFlatL2`` on the ball coordinates: THE BASELINE (1.00×);
  lorentz_flat        ``ShardIndex`` space lorentz, kind flat (inner-product trick + float64 refine),
                      on the same points mapped to the hyperboloid (the mapping is not timed);
  arcosh_torch        the exact Poincaré distance to every item, computed densely in torch
                      (``poincare.pairwise_distance``, float32, gallery chunks of 65,536) + top-k;
  binary, binary_weighted, binary_two_stage, pq, opq, binary_opq
                      ``build_index(points, "poincare", kind, curv=0.1)`` with default options
                      (2 bits per dimension; two-stage re-ranks 10·k candidates by d_H^Σ), searched
                      through the index's ``search`` (query quantisation and top-k assembly included);
  binary_faiss, binary_weighted_faiss
                      the FAISS kernel of ``binary`` / ``binary_weighted`` alone
                      (``IndexBinaryFlat.search`` on queries encoded beforehand), to show what the
                      Python wrapper costs.

Memory: the bytes a method holds for search: vectors or codes, item ids, trained parameters
(``memory_bytes`` of the compressed indexes; ``ntotal · code_size`` for IndexFlatL2; for
``ShardIndex`` its stored vectors plus the 8-byte ids of its ``IndexIDMap2``, not the id hash map;
the float32 tensor for torch). ``B/item`` is the code (or vector) size per item, the paper's memory.

Quality (real embeddings): a ``binary_hyperbolic`` model (timm ``test_resnet``, embed_dim ``--dim``,
c = 0.1, prototype radius 1) trained ``--quality-epochs`` (10) epochs on the digits' train split
(SGD lr 0.05, batch 64, one thread), then all 1,797 digits embedded (70% of them were training
images); queries = the gallery, leave-one-out (the query's own item removed from its list).
Score: mAP@50 with the deep-hashing convention (the papers Table 6 compares with): AP@k = mean of
precision@j over the ranks j <= k holding an item of the query's class, 0 when none does (spec A9).
Ties (Hamming distances are integers) keep FAISS's order.

Targets (the issue), judged in the SINGLE-QUERY regime (a router serves one request at a time; the
batched numbers are printed next to them): lorentz_flat ≥ 0.9× the speed of euclidean_flat; the
binary kinds ≥ 8× faster and ≥ 16× smaller than euclidean_flat, with mAP@50 within 0.01 of float
hyperbolic search (lorentz_flat: the exact geodesic ranking).

Threads: one (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` default to 1 in
the script benchmarks/search.py, before numpy/faiss load; ``faiss.omp_set_num_threads`` and
``torch.set_num_threads`` follow ``OMP_NUM_THREADS``).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

if __name__ == "__main__":  # run as a script: one thread per process for BLAS and FAISS, before numpy and faiss load
    for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")
if __package__ in (None, ""):  # run as `python benchmarks/search.py`: the checkout on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import faiss
import numpy as np
import torch

from benchmarks.harness import parse_sizes, write_results
from orchestrator.geometry import lorentz, poincare
from orchestrator.index import build_index

CURV = 0.1
K = 50
DEFAULT_SIZES = (100_000, 1_000_000)
QUICK_SIZES = (2_000,)
BASELINE = "euclidean_flat"
FLOAT_HYPERBOLIC = "lorentz_flat"
COMPRESSED_KINDS = ("binary", "binary_weighted", "binary_two_stage", "pq", "opq", "binary_opq")
KERNEL_ROWS = {"binary_faiss": "binary", "binary_weighted_faiss": "binary_weighted"}
METHODS = ("euclidean_flat", "lorentz_flat", "arcosh_torch") + COMPRESSED_KINDS + tuple(KERNEL_ROWS)
BINARY_TARGET_KINDS = ("binary", "binary_weighted", "binary_two_stage")
LABELS = {
    "euclidean_flat": "float Euclidean flat (L2)",
    "lorentz_flat": "Lorentz flat (ShardIndex)",
    "arcosh_torch": "naive arcosh (torch)",
    "binary": "binary 2b plain",
    "binary_weighted": "binary 2b weighted",
    "binary_two_stage": "binary 2b two-stage",
    "pq": "D + PQ",
    "opq": "D + OPQ",
    "binary_opq": "binary + OPQ",
    "binary_faiss": "binary plain, FAISS only",
    "binary_weighted_faiss": "binary weighted, FAISS only",
}
TORCH_CHUNK = 65_536
TARGET_LORENTZ_SPEED = 0.9
TARGET_BINARY_SPEED = 8.0
TARGET_BINARY_SMALLER = 16.0
TARGET_MAP_GAP = 0.01


def threads() -> int:
    """Threads for faiss and torch: ``OMP_NUM_THREADS`` (1 unless set before the start)."""
    count = int(os.environ.get("OMP_NUM_THREADS", "1"))
    faiss.omp_set_num_threads(count)
    torch.set_num_threads(count)
    return count


# --------------------------------------------------------------------------- data


def generated_points(n: int, dim: int, seed: int, chunk: int = 100_000) -> np.ndarray:
    """``(n, dim)`` float32 points of the Poincaré ball of curvature ``CURV`` (module docstring)."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        tangent = torch.from_numpy(0.1 * rng.standard_normal((stop - start, dim)))
        out[start:stop] = poincare.expmap0(tangent, CURV).numpy()
    return out


def to_lorentz(points: np.ndarray, chunk: int = 100_000) -> np.ndarray:
    """``(n, d)`` ball points → ``(n, d+1)`` float32 hyperboloid points (isometry, float64 inside)."""
    out = np.empty((len(points), points.shape[1] + 1), dtype=np.float32)
    for start in range(0, len(points), chunk):
        block = torch.from_numpy(points[start:start + chunk].astype(np.float64))
        out[start:start + chunk] = lorentz.from_poincare(block, CURV).numpy()
    return out


# --------------------------------------------------------------------------- methods


@dataclass
class Searcher:
    """One method over one gallery: ``search(prepared queries, k)``; ``prepare`` turns ball-coordinate
    queries into its input (not timed); memory in bytes, ``item_bytes`` per item, build time."""

    name: str
    search: Callable[[Any, int], Any]
    prepare: Callable[[np.ndarray], Any]
    memory_bytes: int
    item_bytes: float
    build_s: float


def arcosh_top_k(queries: torch.Tensor, gallery: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact Poincaré top-k: ``(Q, d), (N, d) -> distances (Q, k), rows (Q, k)``, gallery in chunks."""
    best_d = torch.full((len(queries), 0), float("inf"), dtype=queries.dtype)
    best_i = torch.zeros((len(queries), 0), dtype=torch.int64)
    for start in range(0, len(gallery), TORCH_CHUNK):
        distances = poincare.pairwise_distance(queries, gallery[start:start + TORCH_CHUNK], CURV)
        rows = torch.arange(start, start + distances.shape[1]).expand(len(queries), -1)
        best_d, order = torch.cat([best_d, distances], dim=1).topk(min(k, best_d.shape[1] + distances.shape[1]),
                                                                    dim=1, largest=False)
        best_i = torch.gather(torch.cat([best_i, rows], dim=1), 1, order)
    return best_d, best_i


def build_searcher(name: str, points: np.ndarray) -> Searcher:
    """The method ``name`` over ``points (N, d)`` float32 of the ball (see the module docstring)."""
    n, dim = points.shape
    started = time.perf_counter()
    if name == "euclidean_flat":
        index = faiss.IndexFlatL2(dim)
        index.add(points)
        return Searcher(name, index.search, np.ascontiguousarray, n * index.code_size, index.code_size,
                        time.perf_counter() - started)
    if name == "lorentz_flat":
        shard = build_index(to_lorentz(points), "lorentz", "flat", curv=CURV)
        inner = faiss.downcast_index(shard.index.index)
        return Searcher(name, shard.search, to_lorentz, n * (inner.code_size + 8), inner.code_size,
                        time.perf_counter() - started)
    if name == "arcosh_torch":
        gallery = torch.from_numpy(points)
        return Searcher(name, lambda q, k: arcosh_top_k(q, gallery, k), torch.from_numpy, gallery.nbytes,
                        4 * dim, time.perf_counter() - started)
    kind = KERNEL_ROWS.get(name, name)
    if kind not in COMPRESSED_KINDS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {name!r}")
    index = build_index(points, "poincare", kind, curv=CURV)
    built = time.perf_counter() - started
    if name in KERNEL_ROWS:
        return Searcher(name, index.index.search, lambda q: index.encode(q.astype(np.float64)), index.memory_bytes,
                        index.code_bytes, built)
    return Searcher(name, index.search, np.ascontiguousarray, index.memory_bytes, index.code_bytes, built)


# --------------------------------------------------------------------------- timing


def time_searches(searcher: Searcher, queries: np.ndarray, single: int, batch: int, single_budget_s: float,
                  k: int = K) -> dict[str, Any]:
    """Queries per second: up to ``single`` calls of one query each (stopping once ``single_budget_s``
    seconds have passed, after at least 10 calls), then one call of ``batch`` queries. One
    single-query call before each regime warms up (not timed)."""
    prepared = searcher.prepare(queries)
    searcher.search(prepared[:1], k)
    calls = 0
    started = time.perf_counter()
    while calls < single and (calls < 10 or time.perf_counter() - started < single_budget_s):
        row = calls % len(queries)
        searcher.search(prepared[row:row + 1], k)
        calls += 1
    single_s = time.perf_counter() - started
    searcher.search(prepared[:1], k)
    started = time.perf_counter()
    searcher.search(prepared[:batch], k)
    batch_s = time.perf_counter() - started
    return {"single_calls": calls, "single_s": single_s, "single_qps": calls / single_s,
            "batch_queries": batch, "batch_s": batch_s, "batch_qps": batch / batch_s}


def median_timing(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each rate over repeated ``time_searches`` runs (the runs are kept alongside)."""
    return {"single_calls": runs[0]["single_calls"], "batch_queries": runs[0]["batch_queries"],
            "single_qps": statistics.median(run["single_qps"] for run in runs),
            "batch_qps": statistics.median(run["batch_qps"] for run in runs), "runs": runs}


def paired_ratios(runs: list[dict[str, Any]], baseline_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Speed ratios of a method's runs to the baseline runs timed right before each of them:
    ``single_ratio`` / ``batch_ratio`` = the median over the pairs of ``qps / baseline qps``."""
    single = [run["single_qps"] / base["single_qps"] for run, base in zip(runs, baseline_runs, strict=True)]
    batch = [run["batch_qps"] / base["batch_qps"] for run, base in zip(runs, baseline_runs, strict=True)]
    return {"single_ratio": statistics.median(single), "batch_ratio": statistics.median(batch),
            "single_ratios": single, "batch_ratios": batch}


def add_memory_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row's memory as ratios to the ``euclidean_flat`` row of the same list: ``memory_ratio =
    memory / base memory`` and ``times_smaller = base memory / memory``."""
    base = next(row for row in rows if row["method"] == BASELINE)
    for row in rows:
        row["memory_ratio"] = row["memory_bytes"] / base["memory_bytes"]
        row["times_smaller"] = base["memory_bytes"] / row["memory_bytes"]
    return rows


def measure_size(n: int, dim: int, methods: tuple[str, ...], single: int, batch: int, repeat: int = 1,
                 single_budget_s: float = 30.0, seed: int = 0) -> list[dict[str, Any]]:
    """One row per method for a gallery of ``n`` generated points. Every method is built, then timed
    ``repeat`` times in turn, each time right after the baseline (euclidean_flat, pairs B M1 B M2 ...):
    on a shared machine the load drifts over minutes, so each ratio compares two measurements
    seconds apart (``paired_ratios``). Rates are medians over the runs (the baseline's over all its
    runs); speed ratios are medians over the pairs."""
    points = generated_points(n, dim, seed)
    queries = generated_points(max(single, batch), dim, seed + 1)
    searchers = {}
    for name in methods:
        searchers[name] = build_searcher(name, points)
        print(f"  N={n:,} {LABELS[name]:<28} built in {searchers[name].build_s:.1f} s", flush=True)
    others = [name for name in methods if name != BASELINE]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in methods}
    pairs: dict[str, list[dict[str, Any]]] = {name: [] for name in others}
    for r in range(repeat):
        for name in others or [BASELINE]:
            for timed in dict.fromkeys((BASELINE, name)):
                runs[timed].append(time_searches(searchers[timed], queries, single, batch, single_budget_s))
                last = runs[timed][-1]
                print(f"  N={n:,} run {r + 1}/{repeat} {LABELS[timed]:<28} single {last['single_qps']:10.1f} q/s "
                      f"({last['single_calls']} calls), batched {last['batch_qps']:10.1f} q/s", flush=True)
            if name != BASELINE:
                pairs[name].append(runs[BASELINE][-1])
    rows = []
    for name, searcher in searchers.items():
        ratios = {"single_ratio": 1.0, "batch_ratio": 1.0} if name == BASELINE else paired_ratios(runs[name], pairs[name])
        rows.append({"method": name, "label": LABELS[name], "n": n, "memory_bytes": searcher.memory_bytes,
                     "item_bytes": searcher.item_bytes, "build_s": searcher.build_s, **median_timing(runs[name]),
                     **ratios})
    return add_memory_ratios(rows)


# --------------------------------------------------------------------------- quality


def mean_average_precision_at_k(found_labels: np.ndarray, query_labels: np.ndarray) -> float:
    """mAP@k of ``found_labels (Q, k)`` (retrieved items' labels, best first) for ``query_labels (Q,)``:
    AP = Σ_j precision@j · rel_j / Σ_j rel_j over j = 1..k, 0 for a query with no relevant item in
    its top k (deep-hashing convention, binary_hyperbolic.md A9)."""
    relevant = found_labels == np.asarray(query_labels)[:, None]
    precision = np.cumsum(relevant, axis=1) / np.arange(1, relevant.shape[1] + 1)
    hits = relevant.sum(axis=1)
    ap = np.where(hits > 0, (precision * relevant).sum(axis=1) / np.maximum(hits, 1), 0.0)
    return float(ap.mean())


def leave_one_out(found: np.ndarray, query_rows: np.ndarray, k: int) -> np.ndarray:
    """``(Q, k+1)`` retrieved rows → ``(Q, k)`` without each query's own row (or the last one when
    the query is not in its list, e.g. pushed out by tied items)."""
    keep = found != np.asarray(query_rows)[:, None]
    keep[keep.all(axis=1), -1] = False
    return found[keep].reshape(len(found), k)


def real_embeddings(dim: int, epochs: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Train a ``binary_hyperbolic`` model on the digits' train split (the first ``limit`` items when
    given) and embed all 1,797 digits: ``(embeddings (1797, dim) float32, labels (1797,), train s)``."""
    from torch.utils.data import DataLoader

    from orchestrator.data import ImageTensorDataset, channel_statistics, load_digits
    from orchestrator.methods import create_method
    from orchestrator.models.encoder import EncoderConfig
    from orchestrator.training.config import TrainConfig
    from orchestrator.training.loop import train_generation

    train = load_digits("train", image_size=32)
    if limit is not None:
        train = train.subset(np.arange(min(limit, len(train))))
    every = load_digits("all", image_size=32)
    mean, std = channel_statistics(train)
    method = create_method("binary_hyperbolic", {"curv": CURV})
    torch.manual_seed(0)
    model = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=dim), 10, torch.arange(10))
    data = ImageTensorDataset(train, 32, mean, std)
    started = time.perf_counter()
    train_generation(method, model, data, data, TrainConfig(epochs=epochs, batch_size=64, lr=0.05, augment=False, seed=0))
    seconds = time.perf_counter() - started
    model.eval()
    with torch.no_grad():
        batches = DataLoader(ImageTensorDataset(every, 32, mean, std), batch_size=256)
        embeddings = torch.cat([model.encoder(images).embedding for images, _, _ in batches])
    return embeddings.numpy().astype(np.float32), every.labels, seconds


def measure_quality(embeddings: np.ndarray, labels: np.ndarray, methods: tuple[str, ...], k: int = K) -> list[dict[str, Any]]:
    """mAP@k of every method (kernel-only rows excluded: same ranking as their index) with queries =
    the gallery, leave-one-out; ``gap`` = mAP − the float hyperbolic (lorentz_flat) mAP when present."""
    rows = []
    query_rows = np.arange(len(embeddings))
    for name in methods:
        if name in KERNEL_ROWS:
            continue
        searcher = build_searcher(name, embeddings)
        _, found = searcher.search(searcher.prepare(embeddings), k + 1)
        found = np.asarray(found, dtype=np.int64)
        score = mean_average_precision_at_k(labels[leave_one_out(found, query_rows, k)], labels)
        rows.append({"method": name, "label": LABELS[name], f"map_at_{k}": score})
    reference = next((row[f"map_at_{k}"] for row in rows if row["method"] == FLOAT_HYPERBOLIC), None)
    for row in rows:
        row["gap"] = None if reference is None else row[f"map_at_{k}"] - reference
    return rows


# --------------------------------------------------------------------------- report


def targets(speed: dict[int, list[dict[str, Any]]], quality: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """One verdict per (size, target, method) in the single-query regime (batched value alongside)."""
    gaps = {row["method"]: row["gap"] for row in quality or []}
    verdicts = []
    for n, rows in speed.items():
        by_method = {row["method"]: row for row in rows}
        if FLOAT_HYPERBOLIC in by_method:
            row = by_method[FLOAT_HYPERBOLIC]
            verdicts.append({"n": n, "method": FLOAT_HYPERBOLIC, "target": f"speed >= {TARGET_LORENTZ_SPEED}x",
                             "single": row["single_ratio"], "batched": row["batch_ratio"],
                             "met": row["single_ratio"] >= TARGET_LORENTZ_SPEED})
        for kind in BINARY_TARGET_KINDS:
            if kind not in by_method:
                continue
            row = by_method[kind]
            gap = gaps.get(kind)
            met = (row["single_ratio"] >= TARGET_BINARY_SPEED and row["times_smaller"] >= TARGET_BINARY_SMALLER
                   and gap is not None and abs(gap) <= TARGET_MAP_GAP)
            verdicts.append({"n": n, "method": kind,
                             "target": f"speed >= {TARGET_BINARY_SPEED:g}x, >= {TARGET_BINARY_SMALLER:g}x smaller, "
                                       f"|mAP gap| <= {TARGET_MAP_GAP}",
                             "single": row["single_ratio"], "batched": row["batch_ratio"],
                             "times_smaller": row["times_smaller"], "map_gap": gap, "met": met})
    return verdicts


def format_speed(n: int, rows: list[dict[str, Any]], dim: int) -> str:
    """The table of one gallery size; ``calls``: single-query calls per timing run."""
    header = (f"{'method':<29}{'B/item':>8}{'memory MB':>11}{'× smaller':>11}{'calls':>7}{'single q/s':>12}{'×':>8}"
              f"{'batched q/s':>13}{'×':>8}{'build s':>9}")
    lines = [f"N = {n:,} ({dim}-d, k = {K}; single: calls of 1 query; batched: 1 call of {rows[0]['batch_queries']} "
             f"queries; q/s: median of {len(rows[-1]['runs'])} run(s); ×: median of the ratios to the baseline "
             "timed just before)", header, "-" * len(header)]
    for row in rows:
        lines.append(f"{row['label']:<29}{row['item_bytes']:>8.1f}{row['memory_bytes'] / 1e6:>11.2f}"
                     f"{row['times_smaller']:>10.2f}×{row['single_calls']:>7d}{row['single_qps']:>12.1f}"
                     f"{row['single_ratio']:>7.2f}×{row['batch_qps']:>13.1f}{row['batch_ratio']:>7.2f}×"
                     f"{row['build_s']:>9.1f}")
    return "\n".join(lines)


def format_quality(rows: list[dict[str, Any]], k: int = K) -> str:
    lines = [f"{'method':<29}{f'mAP@{k}':>9}{'Δ vs float hyperbolic':>23}"]
    for row in rows:
        gap = "" if row["gap"] is None else f"{row['gap']:+.4f}"
        lines.append(f"{row['label']:<29}{row[f'map_at_{k}']:>9.4f}{gap:>23}")
    return "\n".join(lines)


def format_targets(verdicts: list[dict[str, Any]]) -> str:
    lines = []
    for v in verdicts:
        extra = ""
        if "times_smaller" in v:
            gap = "n/a" if v["map_gap"] is None else f"{v['map_gap']:+.4f}"
            extra = f", {v['times_smaller']:.2f}× smaller, mAP gap {gap}"
        lines.append(f"target N={v['n']:,} {v['method']}: {v['target']} (single-query) — single {v['single']:.2f}×, "
                     f"batched {v['batched']:.2f}×{extra}: {'met' if v['met'] else 'NOT met'}")
    return "\n".join(lines)


def parse_methods(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [name for name in names if name not in METHODS]
    if unknown or BASELINE not in names:
        raise argparse.ArgumentTypeError(f"methods must include {BASELINE!r} and come from {list(METHODS)}, got {text!r}")
    return tuple(name for name in METHODS if name in names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=parse_sizes, default=None, help="gallery sizes (1e6 accepted); default 1e5,1e6")
    parser.add_argument("--dim", type=int, default=128, help="embedding dimension (generated data and the model)")
    parser.add_argument("--single", type=int, default=200, help="single-query calls per method")
    parser.add_argument("--batch", type=int, default=1000, help="queries of the one batched call per method")
    parser.add_argument("--single-budget", type=float, default=30.0,
                        help="seconds after which a method's single-query calls stop (after at least 10)")
    parser.add_argument("--repeat", type=int, default=1, help="timing runs per method (interleaved; medians)")
    parser.add_argument("--methods", type=parse_methods, default=METHODS, help=f"comma-separated subset of {list(METHODS)}")
    parser.add_argument("--quality-epochs", type=int, default=10, help="epochs of the binary_hyperbolic model")
    parser.add_argument("--quality-limit", type=int, default=None, help="train on the first N digits only (smoke runs)")
    parser.add_argument("--no-quality", action="store_true", help="skip the mAP@50 part")
    parser.add_argument("--quick", action="store_true", help="2,000 items, 20 single calls, batch 100, 1 epoch")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes = args.sizes or list(QUICK_SIZES)
        args.single, args.batch, args.quality_epochs = min(args.single, 20), min(args.batch, 100), 1
    sizes = args.sizes or list(DEFAULT_SIZES)

    count = threads()
    print(f"{count} thread(s); methods: {', '.join(args.methods)}", flush=True)
    speed = {n: measure_size(n, args.dim, args.methods, args.single, args.batch, args.repeat, args.single_budget)
             for n in sizes}
    quality = None
    train_s = None
    if not args.no_quality:
        embeddings, labels, train_s = real_embeddings(args.dim, args.quality_epochs, args.quality_limit)
        print(f"quality: binary_hyperbolic model trained {args.quality_epochs} epoch(s) in {train_s:.1f} s; "
              f"{len(embeddings)} digits embedded", flush=True)
        quality = measure_quality(embeddings, labels, args.methods)
    verdicts = targets(speed, quality)
    print()
    for n in sizes:
        print(format_speed(n, speed[n], args.dim))
        print()
    if quality is not None:
        print(f"mAP@{K}, digits (1,797, leave-one-out), {args.dim}-d binary_hyperbolic embeddings:")
        print(format_quality(quality))
        print()
    print("weighted codes cost 2.5× the plain codes' memory at 2 bits (5d vs 2d bits per item)")
    print(format_targets(verdicts))
    if args.json is not None:
        document = {
            "config": {"sizes": sizes, "dim": args.dim, "k": K, "curv": CURV, "single": args.single, "batch": args.batch,
                       "single_budget_s": args.single_budget, "repeat": args.repeat,
                       "methods": list(args.methods), "quality_epochs": args.quality_epochs,
                       "quality_limit": args.quality_limit, "threads": count},
            "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "faiss": faiss.__version__,
                        "torch": torch.__version__, "numpy": np.__version__, "platform": platform.platform()},
            "speed": {str(n): rows for n, rows in speed.items()},
            "quality": None if quality is None else {"train_s": train_s, "rows": quality},
            "targets": verdicts,
        }
        write_results(args.json, document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
