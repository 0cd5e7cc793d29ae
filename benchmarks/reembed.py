"""Re-embedding throughput: the same generation embedding the same images two ways, in one run.

    python benchmarks/reembed.py [--items 20000] [--concurrency 1,2] [--repeat 3] [--json out.json]
    python benchmarks/reembed.py --address 127.0.0.1:PORT --concurrency 1,2,3   # an existing cluster

One generation (timm ``test_resnet``, embed_dim 32, method ``hbct`` as in pipelines/lifelong.yaml;
``--arch``/``--method`` change it) is saved as a checkpoint with seeded initial weights (the
weights do not change the cost of a forward pass). One gallery: the bundled digits (all 1,797,
upscaled to 32×32) repeated to ``--items`` items with ids 0..N-1. Both paths load the generation
from that checkpoint (sha256-checked) and turn uint8 images into the model's input with
``orchestrator.data.tensors.to_model_input``; both produce the embedding and, for a hyperbolic
generation, its uncertainty.

  plain  a single-process loop written here: fixed-size batches → ``model.encoder`` under
         ``torch.no_grad()``, one torch thread, in the driver;
  ray    ``orchestrator.distributed.gallery_step.embed_gallery`` (``map_batches`` over an actor
         pool of ``c`` actors with 1 CPU each; every actor pins torch to one thread), consumed in
         the driver with ``iter_batches``; once for every ``c`` in ``--concurrency``.

What is measured
----------------
Each path's output batches are time-stamped as they reach the driver. The steady-state rate is
(images after the first batch) / (last batch − first batch): everything one-off (loading the
checkpoint, starting the actors, the first batch's warm-up) is before the first stamp. Also
reported: ``first_batch_s`` (call → first batch out, one-off costs included), ``wall_s`` (call →
last batch out) and, for the Ray path, ``dataset_s`` (the ``embed_gallery`` call itself,
which builds the source dataset in the driver). ``ray.init`` is timed apart and is in none of
these. With ``--repeat R`` every path runs R times (interleaved) and the median is reported.

Target (the issue): Ray Data ≥ 0.9× the plain loop on 2 cores, and scaling with nodes on the
local multi-node cluster (clusters/local_multinode.sh; pass its address with ``--address``).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

if __package__ in (None, ""):  # run as `python benchmarks/reembed.py`: the checkout on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from benchmarks.harness import start_ray, write_results
from orchestrator.data import LabeledImages, channel_statistics, load_digits
from orchestrator.data.tensors import to_model_input
from orchestrator.geometry.geometry import Geometry
from orchestrator.methods import create_method
from orchestrator.methods.loading import load_generation
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig

TARGET_RATIO = 0.9
DEFAULT_ITEMS = 20_000  # the plain loop needs a few seconds for a steady-state number
IMAGE_SIZE = 32


@dataclass(frozen=True)
class Setup:
    """The generation (a saved checkpoint) and the gallery both paths embed."""

    gallery: LabeledImages
    checkpoint_uri: str
    sha256: str
    name: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    arch: str
    method: str
    embed_dim: int


def tiled_digits(items: int) -> LabeledImages:
    """The bundled digits (all splits, 32×32) repeated in order to ``items`` items, ids 0..items-1."""
    base = load_digits("all", image_size=IMAGE_SIZE)
    order = np.arange(items) % len(base)
    return LabeledImages(images=base.images[order], labels=base.labels[order],
                         ids=np.arange(items, dtype=np.int64), class_names=list(base.class_names))


def make_setup(workdir: Path, items: int = DEFAULT_ITEMS, arch: str = "test_resnet", method: str = "hbct",
               embed_dim: int = 32, seed: int = 0) -> Setup:
    """Save a seeded generation under ``workdir/generation`` and tile the gallery."""
    gallery = tiled_digits(items)
    mean, std = channel_statistics(gallery)
    compat = create_method(method)
    torch.manual_seed(seed)
    model = compat.build_model(EncoderConfig(arch=arch, embed_dim=embed_dim), 10, torch.arange(10)).eval()
    uri = str((Path(workdir) / "generation").resolve())
    card = save_generation(model, compat, None, uri, name="bench")
    return Setup(gallery=gallery, checkpoint_uri=uri, sha256=card.sha256, name="bench", mean=mean, std=std,
                 arch=arch, method=method, embed_dim=embed_dim)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(1)``, restoring the previous setting after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# --------------------------------------------------------------------------- timing


class BatchClock:
    """Time stamps of the output batches of one path, relative to the call that started it."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.stamps: list[float] = []
        self.rows: list[int] = []

    def batch_out(self, rows: int) -> None:
        self.stamps.append(time.perf_counter())
        self.rows.append(rows)

    def summary(self) -> dict[str, Any]:
        """Images, batches, steady-state images/s (after the first batch), first-batch and wall seconds."""
        if len(self.stamps) < 2:
            raise ValueError("a throughput needs at least two output batches (more items or a smaller batch size)")
        steady_seconds = self.stamps[-1] - self.stamps[0]
        return {
            "images": int(sum(self.rows)),
            "batches": len(self.rows),
            "steady_images_per_s": sum(self.rows[1:]) / steady_seconds,
            "first_batch_s": self.stamps[0] - self.started,
            "wall_s": self.stamps[-1] - self.started,
        }


@dataclass
class Embedded:
    """What a path produced (ids in output order) and how long it took."""

    ids: np.ndarray
    embeddings: np.ndarray
    uncertainty: np.ndarray
    timing: dict[str, Any]

    def sorted_by_id(self) -> Embedded:
        order = np.argsort(self.ids, kind="stable")
        return Embedded(self.ids[order], self.embeddings[order], self.uncertainty[order], self.timing)


# --------------------------------------------------------------------------- plain loop


def run_plain(setup: Setup, batch_size: int = 256) -> Embedded:
    """The plain loop: load the checkpoint, then embed fixed-size batches in order, one thread."""
    with one_torch_thread(), torch.no_grad():
        clock = BatchClock()
        model, _card = load_generation(setup.checkpoint_uri, expected_sha256=setup.sha256)
        geometry = Geometry(model.space, model.curv)
        images = setup.gallery.images
        embeddings, uncertainty = [], []
        for start in range(0, len(images), batch_size):
            batch = to_model_input(images[start:start + batch_size], IMAGE_SIZE, setup.mean, setup.std)
            embedding = model.encoder(batch).embedding.float()
            embeddings.append(embedding.numpy())
            uncertainty.append(geometry.uncertainty(embedding).numpy())
            clock.batch_out(len(embedding))
    return Embedded(setup.gallery.ids.copy(), np.concatenate(embeddings), np.concatenate(uncertainty),
                    clock.summary())


# --------------------------------------------------------------------------- Ray Data


def run_ray(setup: Setup, concurrency: int, batch_size: int = 256) -> Embedded:
    """The gallery step's read and embedding stages (``gallery_step.embed_gallery``) with
    ``concurrency`` actors of 1 CPU, consumed with ``iter_batches`` (whole output blocks, as they
    arrive: each read task reads one batch). Ray must be initialised (``harness.start_ray``)."""
    from orchestrator.config.gallery import EmbeddingSpec
    from orchestrator.data.gallery_sources import MemorySource
    from orchestrator.distributed.gallery_step import embed_gallery
    from orchestrator.distributed.generation_model import GenerationModel
    from orchestrator.shard_update import ShardUpdate, UpdateKind

    settings = EmbeddingSpec(batch_size=batch_size, concurrency=concurrency, num_cpus=1.0, num_gpus=0.0)
    clock = BatchClock()
    source = MemorySource(setup.gallery, "images")
    model = GenerationModel.from_checkpoint(setup.name, setup.checkpoint_uri, setup.sha256, IMAGE_SIZE,
                                            source.image_format, setup.mean, setup.std)
    whole = ShardUpdate(UpdateKind.EMBED, 0, source.num_items, rows=(0, source.num_items))
    dataset = embed_gallery(source, [whole], model, settings, block_rows=batch_size, rows_per_task=batch_size)
    dataset_seconds = time.perf_counter() - clock.started
    ids, embeddings, uncertainty = [], [], []
    for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
        ids.append(np.asarray(batch["id"], dtype=np.int64))
        embeddings.append(np.stack(batch["embedding"]).astype(np.float32, copy=False))
        uncertainty.append(np.asarray(batch["uncertainty"], dtype=np.float32))
        clock.batch_out(len(ids[-1]))
    timing = clock.summary()
    timing["dataset_s"] = dataset_seconds
    return Embedded(np.concatenate(ids), np.concatenate(embeddings), np.concatenate(uncertainty), timing)


def cluster_description() -> dict[str, Any]:
    """Alive nodes and total CPUs of the Ray cluster this driver is connected to."""
    import ray

    return {"nodes": sum(1 for node in ray.nodes() if node.get("Alive")),
            "cpus": ray.cluster_resources().get("CPU", 0.0)}


# --------------------------------------------------------------------------- comparison and results


def max_difference(a: Embedded, b: Embedded) -> float:
    """Largest absolute difference between two paths' embeddings of the same ids (ValueError when
    the paths did not embed the same ids, each once)."""
    a, b = a.sorted_by_id(), b.sorted_by_id()
    if not np.array_equal(a.ids, b.ids) or np.unique(a.ids).size != a.ids.size:
        raise ValueError(f"the paths embedded different ids ({a.ids.size} and {b.ids.size} rows)")
    return float(np.abs(a.embeddings - b.embeddings).max(initial=0.0))


def median_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every timing field over repeated runs of one path, plus the runs themselves."""
    keys = [key for key in runs[0] if key not in ("images", "batches")]
    summary: dict[str, Any] = {key: statistics.median(run[key] for run in runs) for key in keys}
    summary.update(images=runs[0]["images"], runs=runs)
    return summary


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Steady-state images/s of every Ray path relative to the plain loop."""
    base = results["plain"]["steady_images_per_s"]
    return {f"{path}/plain": r["steady_images_per_s"] / base for path, r in results.items() if path != "plain"}


def format_table(results: dict[str, dict[str, Any]], ray_init_seconds: float | None) -> str:
    """The results as a text table, with the ratios and the target."""
    header = f"{'path':<22}{'images':>8}{'steady img/s':>14}{'ratio':>8}{'1st batch s':>13}{'wall s':>9}"
    lines = [header, "-" * len(header)]
    rel = ratios(results)
    for path, r in results.items():
        ratio = "1.000" if path == "plain" else f"{rel[f'{path}/plain']:.3f}"
        lines.append(f"{path:<22}{r['images']:>8d}{r['steady_images_per_s']:>14.1f}{ratio:>8}"
                     f"{r['first_batch_s']:>13.2f}{r['wall_s']:>9.2f}")
    lines.append("")
    for name, value in rel.items():
        verdict = "met" if value >= TARGET_RATIO else "NOT met"
        lines.append(f"{name}: {value:.3f}× (target ≥ {TARGET_RATIO}×: {verdict})")
    if ray_init_seconds is not None:
        lines.append(f"Ray start-up (not in any number above): ray.init {ray_init_seconds:.2f} s; "
                     "first batch s of a Ray path includes the dataset build, the actors' start and model load")
    return "\n".join(lines)


def parse_concurrency(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def run_all(setup: Setup, concurrency: list[int], batch_size: int, repeat: int) -> tuple[dict, float]:
    """Every path ``repeat`` times, interleaved; returns (median results per path, the largest
    embedding difference between a Ray path and the plain loop)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    largest = 0.0
    for round_ in range(repeat):
        plain = run_plain(setup, batch_size)
        runs.setdefault("plain", []).append(plain.timing)
        for c in concurrency:
            embedded = run_ray(setup, c, batch_size)
            runs.setdefault(f"ray_c{c}", []).append(embedded.timing)
            largest = max(largest, max_difference(plain, embedded))
            print(f"  round {round_ + 1}: plain {plain.timing['steady_images_per_s']:.1f} img/s, "
                  f"ray c={c} {embedded.timing['steady_images_per_s']:.1f} img/s", flush=True)
    return {path: median_runs(path_runs) for path, path_runs in runs.items()}, largest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=DEFAULT_ITEMS, help="gallery size (digits repeated)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--concurrency", type=parse_concurrency, default=[1, 2],
                        help="actor-pool sizes of the Ray path, comma-separated (default 1,2)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every path; the median is reported")
    parser.add_argument("--arch", default="test_resnet")
    parser.add_argument("--method", default="hbct")
    parser.add_argument("--embed-dim", type=int, default=32)
    parser.add_argument("--address", default=None, help="join this Ray cluster instead of starting a local one")
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray (ignored with --address)")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a Ray path misses the target")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.items < 2 * args.batch_size:
        parser.error("--repeat must be ≥ 1 and --items at least two batches")

    import ray

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="reembed_") as workdir:
        setup = make_setup(Path(workdir), args.items, args.arch, args.method, args.embed_dim)
        ray_init_seconds = start_ray(args.num_cpus, address=args.address, ray_data=True)
        try:
            cluster = cluster_description()
            print(f"embedding {args.items} digits (32×32) with {args.arch} ({args.method}, embed_dim "
                  f"{args.embed_dim}), batch {args.batch_size}, 1 torch thread per process; {os.cpu_count()} "
                  f"CPU cores here, Ray cluster of {cluster['nodes']} node(s) / {cluster['cpus']:g} CPUs", flush=True)
            results, largest = run_all(setup, args.concurrency, args.batch_size, args.repeat)
        finally:
            ray.shutdown()
    print()
    print(format_table(results, ray_init_seconds))
    print(f"same embeddings: max |ray − plain| = {largest:.2e} over {args.items} ids")
    if args.json is not None:
        document = {
            "config": {"items": args.items, "batch_size": args.batch_size, "concurrency": args.concurrency,
                       "repeat": args.repeat, "arch": args.arch, "method": args.method,
                       "embed_dim": args.embed_dim, "address": args.address, "torch_threads": 1},
            "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                        "torch": torch.__version__, "ray": ray.__version__, "platform": platform.platform(),
                        "cluster": cluster},
            "ray_init_seconds": ray_init_seconds,
            "results": results,
            "ratios": ratios(results),
            "max_abs_difference": largest,
            "target": {"ray/plain": TARGET_RATIO},
        }
        write_results(args.json, document)
    if args.strict and min(ratios(results).values()) < TARGET_RATIO:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
