"""Cost of a compatible update (train only) against a full backfill as the gallery grows.

    python benchmarks/update_cost.py [--sizes 10000,100000,1000000] [--epochs 20] [--json out.json]

A compatible update trains one new generation against its parent and leaves the gallery as it
is; an incompatible one must also re-embed every gallery item with the new model and rebuild the
gallery's index (a full backfill). This benchmark puts the two costs side by side:

  train      ``orchestrator.training.loop.train_generation`` of one generation for ``--epochs``
             epochs on the bundled digits' train split (1,258 items, 32×32), with the recipe of
             pipelines/lifelong.yaml (test_resnet, embed_dim 32, ``hbct`` aligned to a parent,
             batch 64, SGD lr 0.05, no augmentation). The parent (``hbct``'s parent method on
             classes 0-4, ``--parent-epochs``) is trained first and not timed. Measured once.
  embed      the new generation embedding ``--embed-items`` real images (digits repeated, as in
             benchmarks/reembed.py) through the gallery step's embedding stages (``gallery_step.embed_gallery``) with
             ``--concurrency`` actors
             (``--embed-path plain``: the plain single-process loop instead); the steady-state
             images/s after the first batch. The embedding time of a gallery of N items is
             N / that rate: measured for N ≤ ``--embed-items``, EXTRAPOLATED above it (marked *).
             The one-off start-up of the embedding job (actors, model load) is reported apart.
  index      ``orchestrator.index.build_index`` (``--index-kind``, exact ``flat`` by default) timed
             for real at every N on generated embeddings in the generation's space: once at the
             generation's real width and once at 128 dimensions (float32).

full backfill(N) = embed(N) + index(N); ratio = full backfill / train. The break-even point is
the gallery size at which a full backfill costs as much as the training run (ratio 1), from the
embedding rate and the index's per-item cost at the largest size: N* = train / (1/rate + index(N)/N).
Writing shard files and lineage rows is not counted (it would only add to the backfill).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/update_cost.py`: the checkout on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from benchmarks import reembed
from benchmarks.harness import parse_sizes, start_ray, write_results
from orchestrator.data import ImageTensorDataset, channel_statistics, load_digits
from orchestrator.geometry import lorentz
from orchestrator.geometry.spaces import Space
from orchestrator.index import KINDS, build_index
from orchestrator.methods import create_method, references
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.config import TrainConfig
from orchestrator.training.loop import train_generation

GENERATED_WIDTH = 128
DEFAULT_SIZES = (10_000, 100_000, 1_000_000)


@dataclass(frozen=True)
class TrainedUpdate:
    """The new generation of a compatible update and what training it cost."""

    seconds: float
    epochs: list[dict[str, float]]
    checkpoint_uri: str
    sha256: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    space: Space
    curv: float
    width: int          # columns of an embedding (d+1 for a Lorentz generation)
    arch: str
    method: str
    embed_dim: int

    def summary(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "epochs": self.epochs, "space": self.space.value, "curv": self.curv,
                "width": self.width, "arch": self.arch, "method": self.method, "embed_dim": self.embed_dim}


def train_update(workdir: Path, method: str = "hbct", epochs: int = 20, parent_epochs: int = 2,
                 limit: int | None = None, arch: str = "test_resnet", embed_dim: int = 32) -> TrainedUpdate:
    """Train a parent (not timed), then time the compatible update trained against it, and save the
    update under ``workdir/update``. ``limit``: the first items of the train split only (smoke runs)."""
    images = load_digits("train", image_size=reembed.IMAGE_SIZE)
    if limit is not None:
        images = images.subset(np.arange(min(limit, len(images))))
    mean, std = channel_statistics(images)
    encoder = EncoderConfig(arch=arch, embed_dim=embed_dim)
    config = TrainConfig(epochs=epochs, batch_size=64, lr=0.05, augment=False, seed=0)
    compat = create_method(method)
    with reembed.one_torch_thread():
        parent = _train_parent(compat, images, encoder, config.model_copy(update={"epochs": parent_epochs}),
                               mean, std)
        torch.manual_seed(config.seed)
        model = compat.build_model(encoder, 10, torch.arange(10))
        data = ImageTensorDataset(images, reembed.IMAGE_SIZE, mean, std)
        started = time.perf_counter()
        history = train_generation(compat, model, data, data, config, old_model=parent)
        seconds = time.perf_counter() - started
    uri = str((Path(workdir) / "update").resolve())
    card = save_generation(model, compat, encoder, uri, name="update", parent="parent")
    with torch.no_grad():
        width = int(model.encoder(data[0][0].unsqueeze(0)).embedding.shape[1])
    return TrainedUpdate(seconds=seconds, epochs=[{k: float(v) for k, v in h.items()} for h in history],
                         checkpoint_uri=uri, sha256=card.sha256, mean=mean, std=std, space=model.space,
                         curv=model.curv, width=width, arch=arch, method=method, embed_dim=embed_dim)


def _train_parent(compat, images, encoder, config, mean, std):
    """The old generation: the method's parent method on classes 0-4 of the same items."""
    parent_method = references.parent_method(compat)
    old = images.subset(images.labels < 5)
    torch.manual_seed(1)
    parent = parent_method.build_model(encoder, 10, torch.arange(5))
    data = ImageTensorDataset(old, reembed.IMAGE_SIZE, mean, std)
    train_generation(parent_method, parent, data, data, config)
    return parent


def measure_embedding(update: TrainedUpdate, items: int, path: str = "ray", concurrency: int = 2,
                      batch_size: int = 256) -> dict[str, Any]:
    """The update embedding ``items`` real images (``path`` "ray": ``gallery_step.embed_gallery``, Ray must be
    initialised; "plain": the single-process loop). Returns reembed's timing summary."""
    setup = reembed.Setup(gallery=reembed.tiled_digits(items), checkpoint_uri=update.checkpoint_uri,
                          sha256=update.sha256, name="update", mean=update.mean, std=update.std,
                          arch=update.arch, method=update.method, embed_dim=update.embed_dim)
    if path == "ray":
        embedded = reembed.run_ray(setup, concurrency, batch_size)
    else:
        embedded = reembed.run_plain(setup, batch_size)
    return dict(embedded.timing, path=path, concurrency=concurrency if path == "ray" else None)


def generated_embeddings(n: int, width: int, space: Space, curv: float = 1.0, seed: int = 0) -> np.ndarray:
    """``n`` random float32 points of the space, ``width`` columns each (time first for Lorentz)."""
    rng = np.random.default_rng(seed)
    if space in (Space.EUCLIDEAN, Space.COSINE):
        return rng.standard_normal((n, width), dtype=np.float32)
    tangent = torch.from_numpy(0.1 * rng.standard_normal((n, width if space is Space.POINCARE else width - 1),
                                                         dtype=np.float32))
    points = lorentz.expmap0(tangent, curv)
    return (lorentz.to_poincare(points, curv) if space is Space.POINCARE else points).numpy()


def measure_index(n: int, width: int, space: Space, curv: float = 1.0, kind: str = "flat") -> dict[str, Any]:
    """Time ``build_index`` over ``n`` generated embeddings (generating them is not timed)."""
    embeddings = generated_embeddings(n, width, space, curv)
    started = time.perf_counter()
    index = build_index(embeddings, space, kind, curv=curv)
    seconds = time.perf_counter() - started
    return {"n": n, "width": width, "kind": kind, "seconds": seconds, "ntotal": index.ntotal}


def cost_rows(train_seconds: float, images_per_s: float, measured_items: int,
              index_seconds: dict[int, float]) -> list[dict[str, Any]]:
    """One row per gallery size N: embed = N / rate (extrapolated when N > the items measured),
    full backfill = embed + index build, ratio = full backfill / train."""
    rows = []
    for n in sorted(index_seconds):
        embed = n / images_per_s
        full = embed + index_seconds[n]
        rows.append({"n": n, "train_s": train_seconds, "embed_s": embed, "embed_extrapolated": n > measured_items,
                     "index_s": index_seconds[n], "full_backfill_s": full, "ratio": full / train_seconds})
    return rows


def break_even(train_seconds: float, images_per_s: float, index_seconds: dict[int, float]) -> float:
    """Gallery size at which a full backfill costs as much as training: the embedding rate plus the
    index's per-item cost at the largest measured size."""
    largest = max(index_seconds)
    return train_seconds / (1.0 / images_per_s + index_seconds[largest] / largest)


def format_table(rows: dict[int, list[dict[str, Any]]], break_even_n: dict[int, float]) -> str:
    """The cost table: per gallery size, train only against full backfill at every index width."""
    widths = sorted(rows)
    header = f"{'N':>10}{'train s':>10}{'embed s':>11}" + "".join(
        f"{f'index s d={w}':>15}{f'full s d={w}':>14}{f'full/train d={w}':>18}" for w in widths)
    lines = [header, "-" * len(header)]
    for i, first in enumerate(rows[widths[0]]):
        embed = f"{first['embed_s']:.1f}{'*' if first['embed_extrapolated'] else ' '}"
        line = f"{first['n']:>10d}{first['train_s']:>10.1f}{embed:>11}"
        for w in widths:
            row = rows[w][i]
            line += f"{row['index_s']:>15.3f}{row['full_backfill_s']:>14.1f}{row['ratio']:>17.2f}×"
        lines.append(line)
    lines.append("* extrapolated: N / the embedding rate measured on real images")
    for w in widths:
        lines.append(f"break-even (d={w}): a full backfill costs as much as the training run at "
                     f"N ≈ {break_even_n[w]:,.0f} items")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=parse_sizes, default=list(DEFAULT_SIZES),
                        help="gallery sizes, comma-separated (1e6 accepted); default 10000,100000,1000000")
    parser.add_argument("--epochs", type=int, default=20, help="epochs of the update (pipelines/lifelong.yaml: 20)")
    parser.add_argument("--parent-epochs", type=int, default=2, help="epochs of the parent (not timed)")
    parser.add_argument("--method", default="hbct")
    parser.add_argument("--limit", type=int, default=None, help="train on the first N items only (smoke runs)")
    parser.add_argument("--embed-items", type=int, default=20_000, help="real images the embedding rate is measured on")
    parser.add_argument("--embed-path", choices=("ray", "plain"), default="ray")
    parser.add_argument("--concurrency", type=int, default=2, help="actors of the Ray embedding path")
    parser.add_argument("--batch-size", type=int, default=256, help="embedding batch size")
    parser.add_argument("--index-kind", choices=KINDS, default="flat")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="update_cost_") as workdir:
        update = train_update(Path(workdir), args.method, args.epochs, args.parent_epochs, args.limit)
        print(f"train only: {args.method} update, {args.epochs} epochs on {int(update.epochs[0]['samples'])} "
              f"samples/epoch: {update.seconds:.1f} s", flush=True)
        ray_init_seconds = None
        if args.embed_path == "ray":
            ray_init_seconds = start_ray(ray_data=True)
        try:
            embedding = measure_embedding(update, args.embed_items, args.embed_path, args.concurrency,
                                          args.batch_size)
        finally:
            if args.embed_path == "ray":
                import ray

                ray.shutdown()
    rate = embedding["steady_images_per_s"]
    print(f"embedding ({args.embed_path}): {rate:.1f} images/s on {embedding['images']} real images "
          f"(start-up before the first batch {embedding['first_batch_s']:.1f} s, not in the table)", flush=True)
    index_runs = []
    for width in sorted({update.width, GENERATED_WIDTH}):
        for n in args.sizes:
            index_runs.append(measure_index(n, width, update.space, update.curv, args.index_kind))
            print(f"  index {args.index_kind} d={width} N={n}: {index_runs[-1]['seconds']:.2f} s", flush=True)
    rows, break_even_n = {}, {}
    for width in sorted({update.width, GENERATED_WIDTH}):
        seconds = {run["n"]: run["seconds"] for run in index_runs if run["width"] == width}
        rows[width] = cost_rows(update.seconds, rate, args.embed_items, seconds)
        break_even_n[width] = break_even(update.seconds, rate, seconds)
    print()
    print(f"space {update.space.value}, real width {update.width}; index {args.index_kind}")
    print(format_table(rows, break_even_n))
    if args.json is not None:
        import ray

        document = {
            "config": {key: getattr(args, key) for key in ("sizes", "epochs", "parent_epochs", "method", "limit",
                                                           "embed_items", "embed_path", "concurrency",
                                                           "batch_size", "index_kind")},
            "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                        "torch": torch.__version__, "ray": ray.__version__, "platform": platform.platform()},
            "train": update.summary(),
            "embedding": embedding,
            "ray_init_seconds": ray_init_seconds,
            "index": index_runs,
            "rows": {str(width): width_rows for width, width_rows in rows.items()},
            "break_even_items": {str(width): value for width, value in break_even_n.items()},
        }
        write_results(args.json, document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
