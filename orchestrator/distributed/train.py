"""Ray Train adapter: one model generation trained by a ``TorchTrainer`` (DDP across workers).

Thin on purpose: every worker runs ``GenerationTraining`` (``orchestrator.training.generation``),
the same per-epoch loop as a Tune trial, with the method's hooks around ``train_one_epoch``. The
job travels as plain JSON-able data (``GenerationJob``); each worker loads its data, builds the
model, loads the frozen parent from its checkpoint (sha256 verified), and resumes from the last
Ray Train checkpoint after a failure (``FailureConfig``).
Per-epoch metrics (every loss term, the learning rate, and ``start_epoch``: the epoch this
attempt resumed from) are reported to Ray Train; rank 0 writes
the finished generation (safetensors + card) to ``output_uri`` through the storage layer.
The health check (``orchestrator.training.health``) is judged on rank 0 after every epoch and
agreed by every rank; a stop is reported with the epoch (``health/stop``, its one line), nothing is
written, and the driver raises ``TrainingUnhealthy`` with that line. A stopped run's checkpoint
keeps the stop: an attempt resumed from it stops again at once.
"""
from __future__ import annotations

import logging
import queue
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from orchestrator.config.runtime import RaySettings
from orchestrator.progress import Meter
from orchestrator.training.config import TrainConfig
from orchestrator.training.generation import GenerationJob, GenerationTraining
from orchestrator.training.health import STOP, TrainingUnhealthy
from orchestrator.training.state import load_training_state, save_training_state

log = logging.getLogger(__name__)

_WEIGHTS = "model.safetensors"
_STATE = "training_state"


def train_generation_with_ray(job: GenerationJob, scaling: RaySettings, storage_path: str,
                              run_name: str | None = None, progress: Callable[[str], None] | None = None,
                              on_epoch: Callable[[dict[str, float]], None] | None = None) -> dict[str, Any]:
    """Run ``job`` as a ``TorchTrainer`` sized by ``scaling`` (the pipeline file's ``ray`` section:
    workers, CPUs and GPUs each, retries, epoch checkpoints kept) and return the last reported
    metrics.

    storage_path: Ray Train's persistent storage (absolute local path or URI) for its per-epoch
                  checkpoints; the finished generation goes to ``job.output_uri``.
    Worker failures inside a run resume from the last epoch checkpoint. With ``num_workers`` 0
    the loop runs in this process (Ray Train's local mode): no worker actors, no epoch
    checkpoints kept, no retries. ``progress`` receives
    one line per finished epoch, or a bar on a terminal, and ``on_epoch`` each finished epoch's
    metrics (with ``epoch``), in the driver (see ``EpochReports``).
    """
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchTrainer

    resources = {"CPU": scaling.cpus_per_worker}
    if scaling.use_gpu:
        resources["GPU"] = max(scaling.gpus_per_worker, 1.0)
    run_name = run_name or f"train-{job.name}"
    storage_path, storage_filesystem = _ray_storage(storage_path, job.storage_options)
    local_mode = scaling.num_workers == 0  # the loop runs here, and its own errors reach fit() unwrapped
    watcher = None
    if progress is not None or on_epoch is not None:
        watcher = EpochReports(TrainConfig(**job.training).epochs, progress, on_epoch, in_process=local_mode)
    trainer = TorchTrainer(
        _train_worker,
        train_loop_config={"job": asdict(job), "epoch_queue": None if watcher is None else watcher.queue},
        scaling_config=ScalingConfig(num_workers=scaling.num_workers, use_gpu=scaling.use_gpu,
                                     resources_per_worker=resources),
        run_config=RunConfig(name=run_name, storage_path=storage_path, storage_filesystem=storage_filesystem,
                             failure_config=FailureConfig(max_failures=scaling.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=scaling.checkpoints_to_keep)),
    )
    if watcher is not None:
        watcher.start()
    driver_threads = torch.get_num_threads()
    if local_mode:  # as many intra-op threads as a worker's CPUs (Ray sets OMP_NUM_THREADS so for actors)
        torch.set_num_threads(max(1, int(scaling.cpus_per_worker)))
    failure = Exception if local_mode else TrainingFailedError
    try:
        result = trainer.fit()
    except failure as error:
        raise RuntimeError(f"training generation {job.name!r} failed: {error}") from error
    finally:
        torch.set_num_threads(driver_threads)
        if watcher is not None:
            watcher.stop()
    metrics = dict(result.metrics or {})
    if metrics.get(STOP):
        raise TrainingUnhealthy(str(metrics[STOP]))
    return metrics


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
    """The per-worker loop (runs inside a Ray Train worker): ``GenerationTraining`` epochs, each
    reported with a checkpoint (rank 0), resuming from the last checkpoint after a failure."""
    import ray.train
    import ray.train.torch

    job = GenerationJob(**config["job"])
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    session = GenerationTraining(job, device=ray.train.torch.get_device())
    start_epoch, restored = _restore(ray.train.get_checkpoint(), session.model, session.optimizer)
    if restored.get(STOP):  # the attempt this resumes was stopped by the health check: stop again
        ray.train.report({**restored, "start_epoch": start_epoch})
        return
    if rank == 0:
        session.watch_health(first_loss=restored.get("health/first_loss"))
    # moves the model to the device; DDP when world_size > 1 (a generation that trains no encoder has nothing to sync)
    session.start(forward_model=ray.train.torch.prepare_model(session.model) if session.epochs else None)
    for epoch in range(start_epoch, session.epochs):
        stats = session.train_epoch(epoch, rank=rank, world_size=world_size)
        stop = _agreed(session.check_health(epoch, stats), world_size)
        metrics = {**stats, "start_epoch": start_epoch, **(session.health.measured if session.health else {})}
        if stop is not None:
            metrics[STOP] = stop
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if rank == 0:
                _save_epoch_state(Path(folder), session.model, session.optimizer, epoch, metrics)
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report(metrics, checkpoint=checkpoint)
        if rank == 0 and config.get("epoch_queue") is not None:
            config["epoch_queue"].put({**metrics, "epoch": epoch})
        if stop is not None:
            return  # nothing written: the driver raises TrainingUnhealthy
    session.finish()
    stop = _agreed(session.check_health_at_end(), world_size)
    if stop is not None:
        ray.train.report({"epoch": session.epochs - 1, "start_epoch": start_epoch, STOP: stop})
        return
    if not session.epochs:  # a post-hoc generation: its map's fit is its one report
        ray.train.report(session.fit_metrics())
    if rank == 0:
        card = session.save()
        log.info("generation %s written to %s (sha256 %s)", job.name, job.output_uri, card.sha256)


def _agreed(stop, world_size: int) -> str | None:
    """Rank 0's health verdict (a ``HealthStop`` or None) as every rank's: its line, or None."""
    line = None if stop is None else stop.line
    if world_size > 1:
        import torch.distributed as dist

        shared = [line]
        dist.broadcast_object_list(shared, src=0)
        line = shared[0]
    return line


def _save_epoch_state(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, epoch: int,
                      metrics: dict[str, float]) -> None:
    """Weights (safetensors), optimizer state (pickle-free) and metrics of a finished epoch."""
    from safetensors.torch import save_file

    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(folder / _WEIGHTS))
    save_training_state(str(folder / _STATE), optimizer.state_dict(), epoch, extra={"metrics": metrics})


class EpochReports(threading.Thread):
    """Driver-side progress of one run: rank 0 puts each finished epoch's metrics into a Ray queue
    (``EpochReports.queue``, passed to the workers), and this thread turns them into a ``Meter``
    (a bar on a terminal, else one line per epoch: epoch, loss terms, learning rate), and hands each
    epoch's metrics to ``on_epoch`` (e.g. experiment tracking). Works the same for local,
    object-store and cluster runs: nothing is read back from storage.

    ``in_process``: the loop runs in this process (Ray Train's local mode, which hands the loop its
    config as it is), so the queue is a plain ``queue.Queue``: a Ray queue is an actor, a process of
    its own (about 0.8 s of CPU to start) for metrics that never leave this one."""

    def __init__(self, epochs: int, progress: Callable[[str], None] | None,
                 on_epoch: Callable[[dict[str, float]], None] | None = None, in_process: bool = False):
        super().__init__(daemon=True)
        self.queue: Any
        if in_process:
            self.queue = queue.Queue(maxsize=1000)
        else:
            from ray.util.queue import Queue

            self.queue = Queue(maxsize=1000, actor_options={"num_cpus": 0})
        self.meter = Meter(progress or (lambda line: None), "epoch", epochs, interval=0.0,
                           mode=None if progress else "off")  # no progress asked for: no bar either
        self.on_epoch = on_epoch
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.drain(timeout=0.5)

    def drain(self, timeout: float = 0.0) -> None:
        try:
            metrics = self.queue.get(block=timeout > 0, timeout=timeout or None)
        except queue.Empty:  # ray.util.queue.Empty is one
            return
        finished = int(metrics["epoch"]) + 1  # a resumed attempt starts past the epochs already done
        self.meter.advance(finished - self.meter.done, epoch_note(metrics))
        if self.on_epoch is not None:
            self.on_epoch(metrics)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)
        while not self.queue.empty():
            self.drain()
        self.meter.close()
        if not isinstance(self.queue, queue.Queue):
            self.queue.shutdown()


def epoch_note(metrics: dict[str, float]) -> str:
    """``loss 2.3305 (base 2.2707 entailment 0.1072)  lr 0.05`` for one epoch's metrics."""
    terms = " ".join(f"{k.removeprefix('loss/')} {v:.4f}" for k, v in metrics.items() if k.startswith("loss/"))
    return f"loss {metrics.get('loss', float('nan')):.4f} ({terms})  lr {metrics.get('lr', float('nan')):.4g}"


def _restore(checkpoint, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer) -> tuple[int, dict[str, Any]]:
    """Load the last epoch checkpoint, if any; returns the epoch to start from and that epoch's
    metrics (empty without a checkpoint)."""
    if checkpoint is None:
        return 0, {}
    from safetensors.torch import load_file

    with checkpoint.as_directory() as folder:
        model.load_state_dict(load_file(str(Path(folder) / _WEIGHTS)))
        state = load_training_state(str(Path(folder) / _STATE))
    optimizer.load_state_dict(state.optimizer_state)
    log.info("resuming after epoch %d", state.epoch)
    return state.epoch + 1, dict((state.extra or {}).get("metrics") or {})
