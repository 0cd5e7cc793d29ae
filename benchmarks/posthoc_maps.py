"""The post-hoc maps side by side on one upgrade (issue 39): the parent and the given encoder of a
``pipelines/posthoc.yaml`` run, each map fitted on paired samples of several sizes drawn from the
training items, then evaluated on the evaluation split as the pipeline evaluates a generation.

    python3 benchmarks/posthoc_maps.py runs/posthoc            # after orchestrator run pipelines/posthoc.yaml
    python3 benchmarks/posthoc_maps.py runs/posthoc --pairs 100 500 1257

One row per (map, pairs): the cross-test (the given encoder's queries through the map on the
parent's gallery), the criterion (cross > the parent's own), backfill saved at 0 % re-embedded
((cross − parent self) / (given self − parent self)) on CMC@1 and mAP, the fit's seconds and the
map's parameters. Every row fits on the same models; a row is one seed of one upgrade, so
differences of a point or two are within the digits' noise (one query of 539 is 0.0019).

    python3 benchmarks/posthoc_maps.py --query-cost            # no run needed
    python3 benchmarks/posthoc_maps.py RUN --pipeline FILE --slerp-weights 0 0.25 0.5 0.75   # cosine runs

The added cost per query of each map (``query_cost``): the seconds of the comparison path's
``map_queries`` (what the router, the evaluation, serving and tune all call) per query, in a batch
and alone, on random 32-d cosine embeddings; for ``slerp`` also the old encoder's own forward pass
of an image query (``test_resnet``, 32×32), which only a spherical interpolation path needs.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from orchestrator.comparison import ComparisonPath
from orchestrator.config import load_pipeline
from orchestrator.data import ImageTensorDataset, channel_statistics, load_source
from orchestrator.evaluation import evaluate_generations
from orchestrator.geometry.spaces import Space
from orchestrator.lineage import LineageStore
from orchestrator.methods import create_method
from orchestrator.methods.base import TrainContext
from orchestrator.methods.loading import load_generation
from orchestrator.metrics import KEY_METRICS
from orchestrator.models.adapters import (
    BACKWARD_ADAPTER,
    AffineAdapter,
    ChartMap,
    LowRankAffineAdapter,
    QueryInterpolation,
    ResidualMLPAdapter,
)
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.loop import freeze

#: Row label → (post-hoc method, its parameters).
MAPS: dict[str, tuple[str, dict[str, Any]]] = {"procrustes": ("procrustes", {}),
                                               "low_rank_affine": ("low_rank_affine", {"rank": 16}),
                                               "residual_mlp": ("residual_mlp", {})}
PIPELINE = Path(__file__).resolve().parents[1] / "pipelines" / "posthoc.yaml"


def slerp_maps(weights: Sequence[float]) -> dict[str, tuple[str, dict[str, Any]]]:
    """``slerp`` rows at each weight t (cosine generations only)."""
    return {f"slerp t={t:g}": ("slerp", {"weight": t}) for t in weights}


def measure(storage: str, pairs: Sequence[int], maps: dict[str, tuple[str, dict[str, Any]]] = MAPS,
            pipeline: str | Path = PIPELINE) -> list[dict[str, Any]]:
    """The rows (module docstring) for the run of ``pipeline`` stored under ``storage`` (its
    generation with ``encoder_from``, its parent and given encoder)."""
    config = load_pipeline(str(pipeline), {"storage": storage})
    posthoc = next(g for g in config.generations if g.encoder_from is not None)
    store = LineageStore(config.lineage)
    try:
        parent = _load(store, posthoc.parent)
        given = _load(store, posthoc.encoder_from)
    finally:
        store.close()
    train = load_source(config.data.source, **config.data.loader_kwargs(config.data.train_split))
    test = load_source(config.data.source, **config.data.loader_kwargs(config.data.eval_split))
    mean, std = channel_statistics(train)
    size = config.data.image_size
    train_data, test_data = ImageTensorDataset(train, size, mean, std), ImageTensorDataset(test, size, mean, std)
    lift = {k: posthoc.method.params[k] for k in ("space", "curv", "clip") if k in posthoc.method.params}
    rows = []
    for label, (name, params) in maps.items():
        for count in pairs:
            method = create_method(name, {**lift, **params, "pairs": count})
            model = copy.deepcopy(given)
            model.adapters.clear()
            freeze(model)
            ctx = TrainContext(new_model=model, old_model=parent, train_data=train_data, num_classes=model.num_classes)
            started = time.perf_counter()
            method.on_train_end(ctx)
            seconds = time.perf_counter() - started
            report = evaluate_generations({"parent": parent, "new": model}, test_data, parents={"new": "parent"})
            summaries = {m: report.update_summary("parent", "new", m) for m in KEY_METRICS}
            rows.append({"adapter": label, "pairs": min(count, len(train_data)), "seconds": seconds,
                         "parameters": sum(p.numel() for p in model.adapters[BACKWARD_ADAPTER].parameters()),
                         **summaries})
    return rows


def _load(store, name: str):
    record = store.get_generation(name)
    model, _card = load_generation(record.checkpoint_uri, expected_sha256=record.sha256)
    return freeze(model)


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per (adapter, pairs) (``measure``'s rows: ``adapter``, ``pairs``,
    ``seconds``, ``parameters`` and an ``update_summary`` per key metric), each metric column
    "CMC@1 / mAP"."""
    def pair(row: dict[str, Any], key: str, signed: bool = False) -> str:
        cells = []
        for metric in KEY_METRICS:
            value = row[metric][key]
            cells.append("n/a" if value is None or value != value else (f"{value:+.2f}" if signed else f"{value:.3f}"))
        return " / ".join(cells)

    lines = ["| map | pairs | parent self | given self | cross (through the map) | criterion | backfill saved at 0 % "
             "| fit | parameters |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        criterion = " / ".join("passes" if row[m]["compatible"] else "fails" for m in KEY_METRICS)
        lines.append(f"| {row['adapter']} | {row['pairs']} | {pair(row, 'old_self')} | {pair(row, 'self')} | "
                     f"{pair(row, 'cross')} | {criterion} | {pair(row, 'backfill_saved', True)} | "
                     f"{row['seconds']:.2f} s | {row['parameters']:,} |")
    return "\n".join(lines)


def query_maps(dim: int = 32) -> dict[str, nn.Module]:
    """Each post-hoc map's backward adapter between two ``dim``-wide cosine spaces (rank 16), weights random
    (the cost does not depend on them): what a fitted generation stores."""
    def chart(module: nn.Module) -> ChartMap:
        return ChartMap(module, Space.COSINE, 1.0, Space.COSINE, 1.0)

    return {"procrustes": chart(AffineAdapter(dim, dim, bias=False)),
            "low_rank_affine": chart(LowRankAffineAdapter(dim, dim, min(16, dim))),
            "residual_mlp": chart(ResidualMLPAdapter(dim, dim, 256)),
            "slerp": QueryInterpolation(chart(AffineAdapter(dim, dim, bias=False)), 0.5)}


def _seconds(call: Callable[[], Any], repeats: int) -> float:
    """The median wall time of ``call`` over ``repeats`` calls (after one warm-up call)."""
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@torch.no_grad()
def query_cost(batch: int = 256, dim: int = 32, repeats: int = 200, image_size: int = 32) -> list[dict[str, Any]]:
    """Rows {"what", "batch_us", "single_us"}: microseconds per query of each map's query path
    (``ComparisonPath.map_queries``) in a batch of ``batch`` queries and for one query alone, and
    of the old encoder's forward pass of an image query (what ``slerp`` adds besides its map)."""
    torch.manual_seed(0)
    def path_cost(path: ComparisonPath, n: int) -> float:
        queries, old = torch.randn(n, dim), torch.randn(n, dim)
        others = {"old": old} if path.query_generations else None
        return _seconds(lambda: path.map_queries(queries, dim, others), repeats) / n * 1e6

    rows = []
    for name, adapter in query_maps(dim).items():
        path = ComparisonPath("new", "old", "adapter", Space.COSINE, 1.0, (adapter.eval(),), hops=("old",))
        rows.append({"what": f"{name}: map_queries", "batch_us": path_cost(path, batch), "single_us": path_cost(path, 1)})
    encoder = EncoderConfig(arch="test_resnet", embed_dim=dim, small_input=False)
    old_model = create_method("independent", {}).build_model(encoder, 10, range(10)).eval()
    def encoder_cost(n: int) -> float:
        images = torch.randn(n, 3, image_size, image_size)
        return _seconds(lambda: old_model(images), max(repeats // 10, 3)) / n * 1e6
    rows.append({"what": "slerp: the old encoder's pass of an image query (test_resnet, 32x32)",
                 "batch_us": encoder_cost(batch), "single_us": encoder_cost(1)})
    return rows


def format_cost(rows: Sequence[dict[str, Any]], batch: int) -> str:
    """Markdown: ``query_cost``'s rows, microseconds per query."""
    lines = [f"| per query | in a batch of {batch} | alone |", "|---|---|---|"]
    lines += [f"| {row['what']} | {row['batch_us']:.2f} µs | {row['single_us']:.1f} µs |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The post-hoc maps side by side on one posthoc.yaml run.")
    parser.add_argument("storage", nargs="?", help="the storage of an `orchestrator run pipelines/posthoc.yaml`")
    parser.add_argument("--pairs", type=int, nargs="+", default=[100, 500, 1257],
                        help="paired sample sizes (training items; more than there are means all)")
    parser.add_argument("--query-cost", action="store_true",
                        help="measure the added cost per query of each map instead (no run needed)")
    parser.add_argument("--batch", type=int, default=256, help="queries per batch of the cost measurement")
    parser.add_argument("--pipeline", default=str(PIPELINE), help="the pipeline file of the run (default posthoc.yaml)")
    parser.add_argument("--slerp-weights", type=float, nargs="+",
                        help="measure slerp at these weights t instead of the three maps (cosine generations only)")
    args = parser.parse_args(argv)
    if args.query_cost:
        print(format_cost(query_cost(args.batch), args.batch))
        return 0
    if args.storage is None:
        parser.error("give the storage of a posthoc.yaml run, or --query-cost")
    maps = slerp_maps(args.slerp_weights) if args.slerp_weights else MAPS
    print(format_rows(measure(args.storage, args.pairs, maps, args.pipeline)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
