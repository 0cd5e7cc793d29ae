"""Ray Train adapter: one model generation trained by a ``TorchTrainer`` (DDP across workers).

Thin on purpose: every worker runs the same ``train_one_epoch`` as a local run, with the
method's hooks around it. The job travels as plain JSON-able data (``GenerationJob``); each
worker loads its data, builds the model, loads the frozen parent from its checkpoint (sha256
verified), and resumes from the last Ray Train checkpoint after a failure (``FailureConfig``).
Per-epoch metrics (every loss term, the learning rate, and ``start_epoch``: the epoch this
attempt resumed from) are reported to Ray Train; rank 0 writes
the finished generation (safetensors + card) to ``output_uri`` through the storage layer.
"""
from __future__ import annotations

import copy
import logging
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from orchestrator.data import ImageTensorDataset, load_source
from orchestrator.methods import TrainContext, create_method
from orchestrator.models.encoder import EncoderConfig
from orchestrator.storage import load_generation, load_training_state, save_generation, save_training_state
from orchestrator.training.config import TrainConfig
from orchestrator.training.loop import freeze, make_train_loader, train_one_epoch
from orchestrator.training.optim import build_optimizer, set_learning_rate

log = logging.getLogger(__name__)

_WEIGHTS = "model.safetensors"
_STATE = "training_state"


@dataclass(frozen=True)
class GenerationJob:
    """Everything a worker needs to train one generation (JSON-serialisable).

    data_options: keyword arguments of the source's loader for the training split.
    train_ids: item ids of the training subset (None: the whole split).
    mean, std: per-channel normalisation of the images (shared by every generation).
    init_from_parent: start from the parent's weights (sequential fine-tuning).
    replaces: a model replacement: the encoder starts from ``encoder["pretrained"]`` and the frozen
              model of the alignment term is that starting checkpoint, not the parent
              (stationary_dsimplex.md §6.3, as in the released code).
    """

    name: str
    method: str
    method_params: dict[str, Any]
    encoder: dict[str, Any]
    training: dict[str, Any]
    num_classes: int
    data_source: str
    output_uri: str
    data_options: dict[str, Any] = field(default_factory=dict)
    image_size: int = 32
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.25, 0.25, 0.25)
    train_ids: list[int] | None = None
    parent_name: str | None = None
    parent_uri: str | None = None
    parent_sha256: str | None = None
    seed: int = 0
    storage_options: dict[str, Any] | None = None
    init_from_parent: bool = False
    replaces: bool = False


@dataclass(frozen=True)
class ScalingSettings:
    """Workers of one training run: count, CPUs and GPUs per worker, restarts after failures."""

    num_workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    use_gpu: bool = False
    max_failures: int = 2


def train_generation_with_ray(job: GenerationJob, scaling: ScalingSettings, storage_path: str,
                              run_name: str | None = None,
                              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``job`` as a ``TorchTrainer`` and return the last reported metrics.

    storage_path: Ray Train's persistent storage (absolute local path or URI) for its per-epoch
                  checkpoints; the finished generation goes to ``job.output_uri``.
    Worker failures inside a run resume from the last epoch checkpoint. ``progress`` receives
    one line per finished epoch (local storage only; see ``EpochProgress``).
    """
    from ray.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchTrainer

    resources = {"CPU": scaling.cpus_per_worker}
    if scaling.use_gpu:
        resources["GPU"] = max(scaling.gpus_per_worker, 1.0)
    run_name = run_name or f"train-{job.name}"
    storage_path, storage_filesystem = _ray_storage(storage_path, job.storage_options)
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={"job": asdict(job)},
        scaling_config=ScalingConfig(num_workers=scaling.num_workers, use_gpu=scaling.use_gpu,
                                     resources_per_worker=resources),
        run_config=RunConfig(name=run_name, storage_path=storage_path, storage_filesystem=storage_filesystem,
                             failure_config=FailureConfig(max_failures=scaling.max_failures)),
    )
    watcher = None
    if progress is not None and storage_filesystem is None:
        watcher = EpochProgress(Path(storage_path) / run_name, TrainConfig(**job.training).epochs, progress)
        watcher.start()
    try:
        result = trainer.fit()
    except TrainingFailedError as error:
        raise RuntimeError(f"training generation {job.name!r} failed: {error}") from error
    finally:
        if watcher is not None:
            watcher.stop()
    return dict(result.metrics or {})


def _ray_storage(storage_path: str, storage_options: dict[str, Any] | None):
    """(path, filesystem) for Ray Train's RunConfig. Object storage goes through the same fsspec
    file system as every other file of the run (``storage.open_filesystem``: credentials from the
    AWS environment, ``endpoint_url`` from the options or AWS_ENDPOINT_URL), wrapped for pyarrow;
    Ray then wants the path without its scheme. Local paths pass through unchanged."""
    if "://" not in storage_path or storage_path.startswith("file://"):
        return storage_path.removeprefix("file://"), None
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    from orchestrator.storage import open_filesystem

    filesystem, path = open_filesystem(storage_path, storage_options)
    return path, PyFileSystem(FSSpecHandler(filesystem))


def _train_worker(config: dict[str, Any]) -> None:
    """The per-worker loop (runs inside a Ray Train worker)."""
    import ray.train
    import ray.train.torch

    job = GenerationJob(**config["job"])
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device()
    training = TrainConfig(**job.training)
    method = create_method(job.method, job.method_params)
    encoder_config = EncoderConfig(**job.encoder)

    images = load_source(job.data_source, **job.data_options)
    if job.train_ids is not None:
        images = images.subset(np.flatnonzero(np.isin(images.ids, np.asarray(job.train_ids))))
    train_data = ImageTensorDataset(images, job.image_size, job.mean, job.std, augment=training.augment)
    plain_data = ImageTensorDataset(images, job.image_size, job.mean, job.std)

    torch.manual_seed(job.seed)
    model = method.build_model(encoder_config, job.num_classes, torch.as_tensor(np.unique(images.labels)))
    parent = None
    if job.parent_uri is not None:
        parent, _card = load_generation(job.parent_uri, expected_sha256=job.parent_sha256,
                                        storage_options=job.storage_options)
        if job.init_from_parent:
            model.load_state_dict(parent.state_dict())
    if job.replaces:
        parent = copy.deepcopy(model)
    if parent is not None:
        freeze(parent.to(device))
    optimizer = build_optimizer(model, training)
    start_epoch = _restore(ray.train.get_checkpoint(), model, optimizer)
    forward_model = ray.train.torch.prepare_model(model)  # moves to device; DDP when world_size > 1
    ctx = TrainContext(new_model=model, old_model=parent, train_data=plain_data,
                       num_classes=model.num_classes, device=device, batch_size=max(training.batch_size, 256))
    method.on_train_start(ctx)
    for epoch in range(start_epoch, training.epochs):
        ctx.epoch = epoch
        method.on_epoch_start(ctx)
        lr = set_learning_rate(optimizer, epoch, training)
        loader = make_train_loader(train_data, training, epoch, rank=rank, world_size=world_size)
        stats = train_one_epoch(method, ctx, loader, optimizer, training, forward_model=forward_model)
        metrics = {**stats, "epoch": epoch, "lr": lr, "start_epoch": start_epoch}
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0:
                _save_epoch_state(Path(folder), model, optimizer, epoch, metrics)
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report(metrics, checkpoint=checkpoint)
    method.on_train_end(ctx)
    if rank == 0:
        card = save_generation(model.cpu(), method, encoder_config, job.output_uri, name=job.name,
                               parent=job.parent_name, storage_options=job.storage_options)
        log.info("generation %s written to %s (sha256 %s)", job.name, job.output_uri, card.sha256)


def _save_epoch_state(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, epoch: int,
                      metrics: dict[str, float]) -> None:
    """Weights (safetensors), optimizer state (pickle-free) and metrics of a finished epoch."""
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(folder / _WEIGHTS))
    save_training_state(str(folder / _STATE), optimizer.state_dict(), epoch, extra={"metrics": metrics})


class EpochProgress(threading.Thread):
    """Driver-side progress: reports each new epoch checkpoint of a run stored on the local file
    system as one line (epoch, loss terms, learning rate). Ray's own worker logs stay in Ray's log
    files; object-store runs report nothing here."""

    def __init__(self, run_dir: Path, epochs: int, progress: Callable[[str], None], interval: float = 1.0):
        super().__init__(daemon=True)
        self.run_dir, self.epochs, self.progress, self.interval = run_dir, epochs, progress, interval
        self._stop_event = threading.Event()
        self._seen: set[str] = set()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        for folder in sorted(self.run_dir.glob("checkpoint_*")):
            if folder.name in self._seen:
                continue
            try:
                state = load_training_state(str(folder / _STATE))
            except (OSError, ValueError):
                continue  # still being written, or already removed
            self._seen.add(folder.name)
            metrics = state.extra.get("metrics", {})
            terms = " ".join(f"{k.removeprefix('loss/')} {v:.4f}" for k, v in metrics.items() if k.startswith("loss/"))
            self.progress(f"epoch {state.epoch + 1}/{self.epochs}  loss {metrics.get('loss', float('nan')):.4f}"
                          f" ({terms})  lr {metrics.get('lr', float('nan')):.4g}")

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)
        self.poll()


def _restore(checkpoint, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load the last epoch checkpoint, if any; returns the epoch to start from."""
    if checkpoint is None:
        return 0
    from safetensors.torch import load_file

    with checkpoint.as_directory() as folder:
        model.load_state_dict(load_file(str(Path(folder) / _WEIGHTS)))
        state = load_training_state(str(Path(folder) / _STATE))
    optimizer.load_state_dict(state.optimizer_state)
    log.info("resuming after epoch %d", state.epoch)
    return state.epoch + 1
