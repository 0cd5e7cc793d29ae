"""Training overhead of the orchestrator: the same training run three ways.

    python benchmarks/train_overhead.py [--epochs 5] [--method independent|bct] [--json out.json]

One model (timm ``test_resnet``, embed_dim 32, linear softmax head, cosine space), one data set
(the bundled digits' train split, all ten classes, 32×32, no augmentation), one optimiser
(SGD lr 0.05, momentum 0.9, weight decay 5e-4, cosine schedule stepped per epoch, batch 64, last
incomplete batch dropped) and one method, trained by

  (a) plain   a textbook PyTorch loop written here: DataLoader → forward → loss → backward → step
              (the loss is ``F.cross_entropy`` for ``independent``; for ``bct`` the method's own
              terms, the frozen parent run on the same batch, as any hand-written BCT loop does);
  (b) local   the orchestrator's local loop ``orchestrator.training.loop.train_generation``;
  (c) ray     the Ray Train path ``orchestrator.distributed.train.train_generation_with_ray``
              with one worker (1 CPU), as ``orchestrator run`` trains every generation;
  (d) ray_local  the same call with ``num_workers`` 0 (``ray.num_workers: 0``): Ray Train's local
              mode, the loop in this process, no controller or worker actors.

Every path runs with one torch thread (``torch.set_num_threads(1)`` here; ``OMP_NUM_THREADS=1``
in the Ray worker's runtime environment, which torch reads at start-up).

What is measured
----------------
Throughput is samples per second of the training epochs. The steady state is the median epoch
time over epochs 1..N-1 (epoch 0 pays one-time costs: allocator warm-up, first-touch of the
data); samples per epoch are what the loop counted (``samples``).

For (a) and (b) epoch times are taken in-process; for (d) they are the times the driver receives
each epoch's report (``on_epoch``). For (c) the Ray worker reports after every
epoch with a checkpoint, which Ray persists under the run's storage folder; the end of epoch k is
the modification time of checkpoint k's files, so an epoch of the Ray path costs training plus
its per-epoch checkpoint and report (what a real run pays). Ray's start-up is reported apart:

  ray.init   starting the local Ray instance (excluded from everything else);
  start-up   ``fit()`` called → first epoch begins, estimated as (end of epoch 0 − fit() call)
             − the fastest Ray epoch: the trainer controller, worker process, torch process
             group, data loading and model building in the worker;
  tail       end of the last epoch → ``fit()`` returned (writing the generation, shutting down).

For (a) and (b) ``start-up`` is the time outside the epochs (model, optimiser, method hooks).

Target (the issue): the Ray path's steady-state throughput ≥ 0.9× the plain loop on 2 cores.
The target is printed with the result; the exit code does not depend on it unless ``--strict``.

Pacing by the Ray Train controller (Ray 2.60, Train v2): a worker's ``ray.train.report`` puts its
result in a queue of size one and blocks while the previous result is still there; the controller
empties it when it polls the workers, every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (2 s by
default). With epochs shorter than that, every epoch after the first waits for the poll, so the
Ray path's steady epoch time is about max(epoch, poll interval). ``--ray-health-check-interval``
sets the interval in the benchmark's Ray to show this; ``fastest_epoch_seconds`` (an epoch that
did not wait) is reported next to the median.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/train_overhead.py`: the checkout on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from benchmarks.harness import start_ray, write_results
from orchestrator.data import ImageTensorDataset, LabeledImages, channel_statistics, load_digits
from orchestrator.distributed.runtime import WORKER_ENV_VARS
from orchestrator.methods import CompatibilityMethod, TrainContext, create_method, references
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.config import TrainConfig

TARGET_RATIO = 0.9
PATHS = ("plain", "local", "ray", "ray_local")
LABELS = {"plain": "(a) plain PyTorch loop", "local": "(b) orchestrator local loop", "ray": "(c) Ray Train, 1 worker",
          "ray_local": "(d) Ray Train, local mode"}


@dataclass
class Setup:
    """Everything the three paths share; build it with ``make_setup``."""

    method: str
    images: LabeledImages                 # the training items (digits train split, or its first --limit items)
    data: ImageTensorDataset              # the same items as normalised tensors, no augmentation
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    encoder: EncoderConfig
    training: TrainConfig
    num_classes: int = 10
    image_size: int = 32
    parent: CompatibleModel | None = None  # the frozen parent of a parent-aligned method (bct)
    parent_uri: str | None = None          # where it was saved for the Ray path
    parent_sha256: str | None = None
    workdir: Path = Path(".")               # parent checkpoint and Ray storage go here (make_setup sets it)

    def new_method(self) -> CompatibilityMethod:
        return create_method(self.method)

    def new_model(self) -> CompatibleModel:
        """The same initial weights for every path (seeded)."""
        torch.manual_seed(self.training.seed)
        return self.new_method().build_model(self.encoder, self.num_classes,
                                             torch.as_tensor(np.unique(self.images.labels)))


def make_setup(method: str = "independent", epochs: int = 5, limit: int | None = None, batch_size: int = 64,
               parent_epochs: int = 2, workdir: Path | None = None) -> Setup:
    """The shared model, data and optimiser settings; for a parent-aligned method also a parent
    (``independent`` on classes 0-4 of the same items, trained with the local loop — not timed)."""
    images = load_digits("train", image_size=32)
    if limit is not None:
        images = images.subset(np.arange(min(limit, len(images))))
    mean, std = channel_statistics(load_digits("train", image_size=32))
    training = TrainConfig(epochs=epochs, batch_size=batch_size, lr=0.05, augment=False, seed=0)
    setup = Setup(method=method, images=images, data=ImageTensorDataset(images, 32, mean, std), mean=mean, std=std,
                  encoder=EncoderConfig(arch="test_resnet", embed_dim=32, small_input=False), training=training)
    setup.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="train_overhead_"))
    if setup.new_method().requires_parent:
        _train_parent(setup, parent_epochs)
    return setup


def _train_parent(setup: Setup, epochs: int) -> None:
    from orchestrator.models.checkpoint import save_generation
    from orchestrator.training.loop import train_generation

    parent_method = references.parent_method(setup.new_method())
    old = setup.images.subset(setup.images.labels < setup.num_classes // 2)
    torch.manual_seed(1)
    model = parent_method.build_model(setup.encoder, setup.num_classes, torch.as_tensor(np.unique(old.labels)))
    old_data = ImageTensorDataset(old, setup.image_size, setup.mean, setup.std)
    train_generation(parent_method, model, old_data, old_data, setup.training.model_copy(update={"epochs": epochs}))
    uri = str((setup.workdir / "parent").resolve())
    card = save_generation(model, parent_method, setup.encoder, uri, name="parent")
    setup.parent, setup.parent_uri, setup.parent_sha256 = model.eval(), uri, card.sha256


# --------------------------------------------------------------------------- (a) plain loop


def run_plain(setup: Setup) -> dict[str, Any]:
    """(a) The textbook loop; the optimiser and schedule are written out, not taken from the package."""
    started = time.perf_counter()
    cfg = setup.training
    method = setup.new_method()
    model = setup.new_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=cfg.epochs)
    ctx = None
    if setup.parent is not None:  # bct: the frozen parent and the method's one-off preparation
        for p in setup.parent.parameters():
            p.requires_grad_(False)
        setup.parent.eval()
        ctx = TrainContext(new_model=model, old_model=setup.parent, train_data=setup.data,
                           num_classes=setup.num_classes, batch_size=256)
        method.on_train_start(ctx)
    loader = DataLoader(setup.data, batch_size=cfg.batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(cfg.seed))
    epochs = []
    for epoch in range(cfg.epochs):
        epoch_started = time.perf_counter()
        model.train()
        seen, loss_sum = 0, 0.0
        for images, labels, _ids in loader:
            out = model(images)
            if ctx is None:
                loss = F.cross_entropy(out.logits, labels)
            else:
                with torch.no_grad():
                    old = setup.parent(images)
                loss = torch.stack(list(method.loss(out, old, labels, ctx).values())).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += labels.shape[0]
            loss_sum += loss.item() * labels.shape[0]
        scheduler.step()
        epochs.append({"epoch": epoch, "seconds": time.perf_counter() - epoch_started, "samples": seen,
                       "loss": loss_sum / max(seen, 1)})
    return _summary("plain", epochs, wall=time.perf_counter() - started)


# --------------------------------------------------------------------------- (b) local loop


def run_local(setup: Setup) -> dict[str, Any]:
    """(b) ``orchestrator.training.loop.train_generation`` (the loop a local experiment uses)."""
    from orchestrator.training.loop import train_generation

    started = time.perf_counter()
    model = setup.new_model()
    history = train_generation(setup.new_method(), model, setup.data, setup.data, setup.training,
                               old_model=setup.parent)
    epochs = [{"epoch": int(h["epoch"]), "seconds": h["seconds"], "samples": int(h["samples"]), "loss": h["loss"]}
              for h in history]
    return _summary("local", epochs, wall=time.perf_counter() - started)


# --------------------------------------------------------------------------- (c) Ray Train

DEFAULT_HEALTH_CHECK_S = float(WORKER_ENV_VARS["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"])


def _ray_job(setup: Setup):
    """The ``GenerationJob`` of (c) and (d)."""
    from orchestrator.distributed.train import GenerationJob

    return GenerationJob(
        name="bench", method=setup.method, method_params={}, encoder=setup.encoder.model_dump(mode="json"),
        training=setup.training.model_dump(mode="json"), num_classes=setup.num_classes, data_source="digits",
        data_options={"split": "train", "image_size": setup.image_size}, image_size=setup.image_size,
        mean=tuple(setup.mean), std=tuple(setup.std), train_ids=setup.images.ids.tolist(),
        parent_name="parent" if setup.parent_uri else None, parent_uri=setup.parent_uri,
        parent_sha256=setup.parent_sha256, seed=setup.training.seed,
        output_uri=str((setup.workdir / "ray-output").resolve()),
    )


def run_ray(setup: Setup, run_name: str = "train-overhead") -> dict[str, Any]:
    """(c) ``train_generation_with_ray`` with one worker; Ray must be initialised (``harness.start_ray``)."""
    from orchestrator.config.runtime import RaySettings
    from orchestrator.distributed.train import train_generation_with_ray

    storage = (setup.workdir / "ray").resolve()
    job = _ray_job(setup)
    fit_called = time.time()
    # every epoch's checkpoint is kept: their times are the epoch boundaries measured here
    scaling = RaySettings(num_workers=1, cpus_per_worker=1, max_failures=0,
                              checkpoints_to_keep=setup.training.epochs)
    metrics = train_generation_with_ray(job, scaling, storage_path=str(storage), run_name=run_name)
    fit_returned = time.time()
    ends = checkpoint_times(storage / run_name)
    if len(ends) != setup.training.epochs:
        raise RuntimeError(f"expected {setup.training.epochs} epoch checkpoints under {storage / run_name}, "
                           f"found {len(ends)}")
    return _ray_summary("ray", metrics, ends, fit_called, fit_returned)


def run_ray_local(setup: Setup) -> dict[str, Any]:
    """(d) ``train_generation_with_ray`` in Ray Train's local mode (``num_workers`` 0), one torch
    thread; epoch ends are when the driver receives each epoch's report. Ray must be initialised
    (the epoch reports travel through a Ray queue, as in a pipeline run)."""
    from orchestrator.config.runtime import RaySettings
    from orchestrator.distributed.train import train_generation_with_ray

    ends: list[float] = []
    fit_called = time.time()
    metrics = train_generation_with_ray(_ray_job(setup), RaySettings(num_workers=0, cpus_per_worker=1),
                                        storage_path=str((setup.workdir / "ray-local").resolve()),
                                        run_name="train-overhead-local", on_epoch=lambda m: ends.append(time.time()))
    fit_returned = time.time()
    if len(ends) != setup.training.epochs:
        raise RuntimeError(f"expected {setup.training.epochs} epoch reports, received {len(ends)}")
    return _ray_summary("ray_local", metrics, ends, fit_called, fit_returned)


def _ray_summary(path: str, metrics: dict[str, Any], ends: list[float], fit_called: float,
                 fit_returned: float) -> dict[str, Any]:
    """The summary of a Ray path (c, d) from its epochs' end times (epoch seconds, in order) and
    the times the training call was made and returned. One worker, or none: every epoch handles
    the same number of items. The fastest epoch interval is an epoch that did not wait for the
    controller (see ``main``): the best estimate of what epoch 0 itself cost, so start-up is
    (end of epoch 0 − call) − the fastest epoch."""
    samples = int(metrics["samples"])
    epochs = [{"epoch": i, "seconds": None if i == 0 else ends[i] - ends[i - 1], "samples": samples,
               "end_after_fit_s": ends[i] - fit_called} for i in range(len(ends))]
    epochs[-1]["loss"] = float(metrics["loss"])
    summary = _summary(path, epochs, wall=fit_returned - fit_called)
    summary["fastest_epoch_seconds"] = min(e["seconds"] for e in epochs[1:])
    summary["first_epoch_end_after_fit_s"] = ends[0] - fit_called
    summary["startup_seconds"] = max(0.0, ends[0] - fit_called - summary["fastest_epoch_seconds"])
    summary["tail_seconds"] = fit_returned - ends[-1]
    return summary


def checkpoint_times(run_dir: Path) -> list[float]:
    """End time (epoch seconds) of every epoch of a Ray Train run: the newest file modification
    time in each persisted ``checkpoint_*`` folder, in order."""
    times = []
    for folder in run_dir.rglob("checkpoint_*"):
        if folder.is_dir():
            files = [p.stat().st_mtime for p in folder.rglob("*") if p.is_file()]
            times.append(max(files, default=folder.stat().st_mtime))
    return sorted(times)


# --------------------------------------------------------------------------- results


def _summary(path: str, epochs: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """Throughput of one path from its per-epoch records (``seconds`` None: not measured)."""
    timed = [e for e in epochs if e["seconds"] is not None]
    steady = [e for e in timed if e["epoch"] >= 1] or timed
    steady_seconds = statistics.median(e["seconds"] for e in steady)
    samples_per_epoch = epochs[-1]["samples"]
    result: dict[str, Any] = {
        "path": path,
        "epochs": epochs,
        "samples_per_epoch": samples_per_epoch,
        "samples_total": sum(e["samples"] for e in epochs),
        "steady_epoch_seconds": steady_seconds,
        "steady_samples_per_s": samples_per_epoch / steady_seconds,
        "wall_seconds": wall,
        "final_loss": epochs[-1].get("loss"),
    }
    if len(timed) == len(epochs):  # in-process paths: every epoch timed
        epoch_seconds = sum(e["seconds"] for e in epochs)
        result["mean_samples_per_s"] = result["samples_total"] / epoch_seconds
        result["startup_seconds"] = wall - epoch_seconds
    return result


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Steady-state throughput of (b), (c) and (d) relative to (a)."""
    base = results["plain"]["steady_samples_per_s"]
    return {f"{path}/plain": results[path]["steady_samples_per_s"] / base for path in PATHS[1:] if path in results}


def format_table(results: dict[str, dict[str, Any]], ray_init_seconds: float | None = None) -> str:
    header = (f"{'path':<30}{'samples/ep':>11}{'steady s/ep':>12}{'steady smp/s':>13}{'mean smp/s':>11}"
              f"{'start-up s':>11}{'wall s':>9}")
    lines = [header, "-" * len(header)]
    for path in PATHS:
        if path not in results:
            continue
        r = results[path]
        mean = f"{r['mean_samples_per_s']:.1f}" if "mean_samples_per_s" in r else "-"
        lines.append(f"{LABELS[path]:<30}{r['samples_per_epoch']:>11d}{r['steady_epoch_seconds']:>12.3f}"
                     f"{r['steady_samples_per_s']:>13.1f}{mean:>11}{r['startup_seconds']:>11.2f}{r['wall_seconds']:>9.2f}")
    lines.append("")
    for name, value in ratios(results).items():
        label = {"local/plain": "(b)/(a) local loop / plain", "ray/plain": "(c)/(a) Ray Train / plain",
                 "ray_local/plain": "(d)/(a) local mode / plain"}[name]
        lines.append(f"{label:<30}{value:>8.3f}×")
    if "ray" in results:
        r = results["ray"]
        verdict = "met" if ratios(results)["ray/plain"] >= TARGET_RATIO else "NOT met"
        lines.append(f"target: Ray path ≥ {TARGET_RATIO}× the plain loop (steady state) — {verdict}")
        lines.append(f"Ray epochs: fastest {r['fastest_epoch_seconds']:.3f} s, median {r['steady_epoch_seconds']:.3f} s "
                     f"(checkpoint intervals; the fastest did not wait for the controller's poll)")
        fixed = [f"fit() → first epoch ≈ {r['startup_seconds']:.2f} s",
                 f"last epoch → fit() returns {r['tail_seconds']:.2f} s"]
        if ray_init_seconds is not None:
            fixed.insert(0, f"ray.init {ray_init_seconds:.2f} s")
        lines.append("Ray fixed overhead (not in the throughput): " + "; ".join(fixed))
    if "ray_local" in results:
        r = results["ray_local"]
        lines.append(f"local mode fixed overhead: train_generation_with_ray() → first epoch ≈ {r['startup_seconds']:.2f} s; "
                     f"last epoch → return {r['tail_seconds']:.2f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--method", choices=("independent", "bct"), default="independent")
    parser.add_argument("--parent-epochs", type=int, default=2, help="epochs of bct's parent (not timed)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    parser.add_argument("--limit", type=int, default=None, help="train on the first N items only (smoke runs)")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the Ray path misses the target")
    parser.add_argument("--ray-health-check-interval", type=float, default=DEFAULT_HEALTH_CHECK_S, metavar="S",
                        help="RAY_TRAIN_HEALTH_CHECK_INTERVAL_S of the Ray Train controller (default: the "
                             f"pipeline's {DEFAULT_HEALTH_CHECK_S} s; Ray's own default is 2 s); it paces epochs "
                             "shorter than itself")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if "plain" not in paths or not set(paths) <= set(PATHS):
        parser.error(f"--paths: a subset of {','.join(PATHS)} that includes plain (the baseline)")
    if {"ray", "ray_local"} & set(paths) and args.epochs < 2:
        parser.error("--epochs: the Ray paths need at least 2 epochs (their epoch times are intervals)")
    with tempfile.TemporaryDirectory(prefix="train_overhead_") as workdir:
        setup = make_setup(args.method, args.epochs, args.limit, parent_epochs=args.parent_epochs, workdir=Path(workdir))
        print(f"training {len(setup.images)} digits (32×32, 10 classes), test_resnet embed_dim 32, method "
              f"{args.method}, {args.epochs} epochs, batch {setup.training.batch_size}, 1 torch thread; "
              f"{os.cpu_count()} CPU cores", flush=True)
        results: dict[str, dict[str, Any]] = {}
        ray_init_seconds = None
        for path in paths:
            if path in ("ray", "ray_local"):
                # the Ray Train controller takes the workers' reports when it polls them, and a worker's
                # ray.train.report waits while its previous report is untaken: epochs shorter than the
                # polling interval are paced by it
                seconds = start_ray(env_vars={"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(args.ray_health_check_interval)})
                ray_init_seconds = seconds if path == "ray" else ray_init_seconds
                try:
                    results[path] = (run_ray if path == "ray" else run_ray_local)(setup)
                finally:
                    import ray

                    ray.shutdown()
            else:
                results[path] = (run_plain if path == "plain" else run_local)(setup)
            print(f"  {LABELS[path]}: {results[path]['steady_samples_per_s']:.1f} samples/s (steady state)", flush=True)
    print()
    print(format_table(results, ray_init_seconds))
    if args.json is not None:
        import ray

        document = {
            "config": {"method": args.method, "epochs": args.epochs, "items": len(setup.images),
                       "batch_size": setup.training.batch_size, "arch": setup.encoder.arch,
                       "embed_dim": setup.encoder.embed_dim, "torch_threads": 1, "limit": args.limit,
                       "ray_health_check_interval_s": args.ray_health_check_interval},
            "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                        "ray": ray.__version__, "platform": platform.platform()},
            "results": results,
            "ray_init_seconds": ray_init_seconds,
            "ratios": ratios(results),
            "target": {"ray/plain": TARGET_RATIO,
                       "met": None if "ray" not in results else ratios(results)["ray/plain"] >= TARGET_RATIO},
        }
        write_results(args.json, document, lead="\n")
    if args.strict and "ray" in results and ratios(results)["ray/plain"] < TARGET_RATIO:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
