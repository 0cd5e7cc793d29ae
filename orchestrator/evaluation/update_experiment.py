"""A single compatible-update experiment (extended-class by default) on an in-memory dataset.

For every method: its family's old model φ_o is trained on the first classes, its unaligned
reference φ_* and the method's new model φ_n on all classes (φ_n aligned to φ_o); then all
generations are evaluated on the held-out split (query = gallery, leave-one-out) and each update
is summarised by self / cross retrieval, the empirical criterion, P_com and P_up (hbct.md §11).
Old and reference models are shared between methods of the same geometry. An entry
``(name, params, old_params)`` trains its old model with ``old_params`` over the parent method's
fields (as a pipeline can set a field on its first generation alone); its φ_* and new model keep
``params``.

Trainings are independent given their inputs (each is seeded from the training seed, the method
and the classes it sees), so ``run_update_experiment(..., workers=N)`` trains the old and
reference models, then the new models, in N processes (``_trainer_context``, one torch thread each) and gets
the same weights as one process.

Every training is checked by the pipeline's health rule (``orchestrator.training.health``,
``ExperimentSettings.health``): own CMC@1 on a sample of the evaluation split, of the classes the
model trains on, and its loss; a model that does not learn raises ``TrainingUnhealthy`` (its one
line names the model, e.g. ``ref/independent: own CMC@1 0.017 after 4 epochs, chance is 0.016``).
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from orchestrator import limits
from orchestrator.data import ImageTensorDataset, LabeledImages, channel_statistics, load_digits
from orchestrator.data.scenarios import extended_class
from orchestrator.evaluation import CompatibilityReport, evaluate_generations
from orchestrator.gc_startup import start_worker_process
from orchestrator.methods import CompatibilityMethod, create_method, references
from orchestrator.metrics import KEY_METRICS, METRICS, UPDATE_SCORES, format_value
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.config import HealthSpec, TrainConfig
from orchestrator.training.health import HealthMonitor, health_sample
from orchestrator.training.loop import train_generation
from orchestrator.training.seeds import derive_seed

log = logging.getLogger(__name__)

DEFAULT_TRAINING = TrainConfig(epochs=12, batch_size=64, lr=0.05, augment=False)


class ExperimentSettings(BaseModel):
    """Sizes and training settings of an update experiment; defaults fit 2 CPU cores."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    arch: str = "test_resnet"
    new_arch: str | None = None
    embed_dim: int = Field(32, ge=2, le=limits.MAX_EMBED_DIM)
    image_size: int = Field(32, ge=8, le=limits.MAX_IMAGE_SIZE)
    small_input: bool = False
    old_class_fraction: float = Field(0.5, gt=0, lt=1)
    training: TrainConfig = DEFAULT_TRAINING
    health: HealthSpec = HealthSpec()


@dataclass
class UpdateResult:
    """The evaluated generations and one summary per method (keys of ``CompatibilityReport.compatibility``
    per metric, e.g. ``summaries["bct"]["cmc@1"]["p_com"]``), with the trained models."""

    report: CompatibilityReport
    summaries: dict[str, dict[str, dict[str, float | bool]]]
    generations: dict[str, tuple[str, str]]  # new generation → (its old generation, its reference φ_*)
    models: dict[str, CompatibleModel]  # every trained generation by name (old, reference and new)
    train_seconds: dict[str, float] = field(default_factory=dict)  # wall time of each one's training

    def format_summary(self, metrics: Sequence[str] = KEY_METRICS) -> str:
        header = f"{'method':<18}" + "".join(
            f"{m + ' ' + col.replace('p_', 'P_'):>14}" for m in metrics for col in UPDATE_SCORES
        ) + f"{'compatible':>12}"
        lines = [header, "-" * len(header)]
        for method, per_metric in self.summaries.items():
            cells = "".join(
                format_value(per_metric[m][col], 3, 14) for m in metrics for col in UPDATE_SCORES
            )
            verdict = "yes" if per_metric[metrics[0]]["compatible"] else "no"
            lines.append(f"{method:<18}{cells}{verdict:>12}")
        return "\n".join(lines)


class UpdateExperiment:
    """Trains and evaluates generations on a train / evaluation split (digits by default)."""

    def __init__(
        self,
        settings: ExperimentSettings | None = None,
        train_images: LabeledImages | None = None,
        eval_images: LabeledImages | None = None,
        device: torch.device | str = "cpu",
    ):
        self.settings = settings or ExperimentSettings()
        self.train_images = train_images if train_images is not None else load_digits("train")
        self.eval_images = eval_images if eval_images is not None else load_digits("test")
        self.device = torch.device(device)
        self.mean, self.std = channel_statistics(self.train_images)

    def dataset(self, images: LabeledImages, augment: bool = False) -> ImageTensorDataset:
        return ImageTensorDataset(images, self.settings.image_size, self.mean, self.std, augment=augment)

    def old_classes(self) -> np.ndarray:
        """Class ids of the old generation: the first ``old_class_fraction`` of the classes."""
        old_idx, _ = extended_class(self.train_images.labels, self.settings.old_class_fraction)
        return np.unique(self.train_images.labels[old_idx])

    def train(
        self,
        method: CompatibilityMethod,
        classes: Sequence[int] | np.ndarray | None = None,
        parent: CompatibleModel | None = None,
        arch: str | None = None,
        init_from_parent: bool = False,
        name: str | None = None,
    ) -> CompatibleModel:
        """Train a generation with ``method`` on the training items of ``classes`` (all when None);
        ``init_from_parent``: start from ``parent``'s weights (sequential fine-tuning, as a pipeline
        generation with ``init_from_parent: true``) instead of the seeded initialisation. Checked
        by ``settings.health`` (``health_monitor``; ``name`` names the model in a stop's line)."""
        images = self.train_images
        if classes is not None:
            images = images.subset(np.flatnonzero(np.isin(images.labels, np.asarray(classes))))
        encoder = EncoderConfig(arch=arch or self.settings.arch, embed_dim=self.settings.embed_dim,
                                small_input=self.settings.small_input)
        seen = torch.as_tensor(np.unique(images.labels))
        torch.manual_seed(derive_seed(self.settings.training.seed, method.name,
                                      method.params.model_dump(mode="json"), seen.tolist()))
        model = method.build_model(encoder, self.train_images.num_classes, seen)
        if init_from_parent:
            if parent is None:
                raise ValueError(f"{method.name}: init_from_parent needs a parent model")
            model.load_generation_weights(parent.deployable_state_dict())
        train_generation(
            method, model,
            train_data=self.dataset(images, augment=self.settings.training.augment),
            plain_data=self.dataset(images),
            config=self.settings.training,
            old_model=parent,
            device=self.device,
            health=self.health_monitor(name or method.name, classes, from_scratch=not init_from_parent),
        )
        return model

    def health_monitor(self, name: str, classes: Sequence[int] | np.ndarray | None,
                       from_scratch: bool = True) -> HealthMonitor | None:
        """The health check of a model trained on ``classes``: its sample is drawn from the
        evaluation split (``eval_images``), never from the training items; None when disabled."""
        spec = self.settings.health
        if not spec.enabled:
            return None
        sample = health_sample(self.eval_images, None if classes is None else np.asarray(classes), spec.sample,
                               self.settings.image_size, self.mean, self.std)
        training = self.settings.training
        return HealthMonitor(spec, name, training.epochs, training.warmup_epochs, sample, check_loss=from_scratch,
                             device=self.device)

    def evaluate(self, models: dict[str, CompatibleModel], parents: dict[str, str] | None = None) -> CompatibilityReport:
        return evaluate_generations(models, self.dataset(self.eval_images), parents=parents, device=self.device)


def run_update_experiment(
    methods: Sequence[str | tuple[str, dict] | tuple[str, dict, dict] | tuple[str, dict, dict, bool]],
    settings: ExperimentSettings | None = None,
    experiment: UpdateExperiment | None = None,
    workers: int = 1,
) -> UpdateResult:
    """Train φ_o, φ_* and φ_n for every method (see module docstring) and evaluate them together.

    methods: a method name, ``(name, params)``, ``(name, params, old_params)``: fields of the old
             model's method set over its ``references.parent_method`` (e.g. ``{"mlr_learn_scale": True}`` for
             an HBCT old generation alone); φ_* and the new model follow ``params``; or
             ``(name, params, old_params, init_from_parent)``: True starts the new model from its
             old model's weights (needs the same architecture: ``new_arch`` None).
    workers: processes that train in parallel (1: all in this process). The old and reference
             models train first, then the new models; the weights do not depend on ``workers``.
             Methods registered only in this process (not importable by name, nor through
             ``ORCHESTRATOR_PLUGINS``) need ``workers=1``.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    experiment = experiment or UpdateExperiment(settings)
    new_arch = experiment.settings.new_arch
    models: dict[str, CompatibleModel] = {}
    train_seconds: dict[str, float] = {}
    parents: dict[str, str] = {}
    generations: dict[str, tuple[str, str]] = {}

    # 1. which models to train: old / reference models once per distinct (role, method, params)
    base_jobs: dict[str, tuple[str, CompatibilityMethod, dict[str, Any]]] = {}  # key → (name, method, kwargs)
    new_jobs: list[tuple[str, CompatibilityMethod, str, bool]] = []  # (label, method, old model, init_from_parent)

    def shared(role: str, method: CompatibilityMethod, **kwargs) -> str:
        key = json.dumps([role, method.name, method.params.model_dump(mode="json")], sort_keys=True)
        if key not in base_jobs:
            name = f"{role}/{method.name}" if method.name == "independent" else f"{role}/{method.name}#{len(base_jobs)}"
            base_jobs[key] = (name, method, kwargs)
        return base_jobs[key][0]

    for entry in methods:
        entry = (entry,) if isinstance(entry, str) else tuple(entry)
        name, params, old_params, init_from_parent = (*entry, *(None, {}, {}, False)[len(entry):])
        if init_from_parent and new_arch is not None:
            raise ValueError(f"{name}: init_from_parent needs the old model's architecture (new_arch is {new_arch!r})")
        method = create_method(name, params)
        old = shared("old", _old_method(method, old_params), classes=experiment.old_classes())
        reference = shared("ref", references.reference_method(method), arch=new_arch)
        label = name if name not in generations else f"{name}#{len(generations)}"
        new_jobs.append((label, method, old, bool(init_from_parent)))
        parents[label] = old
        generations[label] = (old, reference)

    # 2. train them: the parent-free models first, then every new model against its old model
    with _trainer_pool(workers) as pool:
        pending = {name: _submit(pool, experiment, method, name=name, **kwargs)
                   for name, method, kwargs in base_jobs.values()}
        _collect(pending, models, train_seconds)
        pending = {label: _submit(pool, experiment, method, parent=models[old], arch=new_arch,
                                  init_from_parent=init_from_parent, name=label)
                   for label, method, old, init_from_parent in new_jobs}
        _collect(pending, models, train_seconds)
    models = {name: _in_private_memory(model) for name, model in models.items()}

    report = experiment.evaluate(models, parents)
    summaries = {
        label: {metric: report.compatibility(old, label, reference, metric) for metric in METRICS}
        for label, (old, reference) in generations.items()
    }
    return UpdateResult(report, summaries, generations, models, train_seconds)


def _collect(pending: dict[str, Future], models: dict[str, CompatibleModel], seconds: dict[str, float]) -> None:
    """Wait for every training of ``pending`` (name → future of ``_train``) and file its model and time."""
    for name, future in pending.items():
        models[name], seconds[name] = future.result()


def _in_private_memory(model: CompatibleModel) -> CompatibleModel:
    """``model`` with every parameter and buffer in this process's own memory. A tensor that comes
    back from a pool process, and one this process sent to it (an old model, the parent of a new
    one: torch moves the sender's storage into shared memory), lives in shared memory that holds an
    open file descriptor per storage (torch's ``file_descriptor`` sharing): a kept result of a small
    one-method experiment held 285 of them, and a test session keeping a few results went past the
    usual limit of 1,024. A model that never crossed a process is returned as it is."""
    with torch.no_grad():
        for module in model.modules():
            for parameter in module.parameters(recurse=False):
                if parameter.is_shared():
                    parameter.data = parameter.data.clone()
            for name, buffer in module.named_buffers(recurse=False):
                if buffer is not None and buffer.is_shared():
                    module._buffers[name] = buffer.clone()
    return model


def _old_method(method: CompatibilityMethod, old_params: dict[str, Any]) -> CompatibilityMethod:
    """The method of ``method``'s old model: its ``references.parent_method``, with ``old_params`` over its fields."""
    parent = references.parent_method(method)
    if not old_params:
        return parent
    return create_method(parent.name, {**parent.params.model_dump(mode="json"), **old_params})


class _InProcess(Executor):
    """An executor that runs each call at once in this process (``workers=1``)."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:  # noqa: BLE001  (re-raised by future.result())
            future.set_exception(error)
        return future


def _trainer_pool(workers: int) -> Executor:
    if workers == 1:
        return _InProcess()
    return ProcessPoolExecutor(max_workers=workers, mp_context=_trainer_context(),
                               initializer=start_worker_process, initargs=((__name__,), 1, dict(os.environ)))


def _trainer_context() -> multiprocessing.context.BaseContext:
    """Where the trainer processes come from: forks of this process's fork server, a process that
    has imported this module (torch, timm, the methods) once and never run torch's thread pools. A
    fork of a process that has run them can deadlock, so never this one. Every experiment of this
    process forks from the same server (``benchmarks/trainer_processes.py``, three small two-process
    experiments in a new process, its own imports included: 27.0 s of CPU spawned, 13.0 s forked,
    the 2-core Xeon); spawn where there is no fork. The workers take this process's environment as
    the pool starts (``start_worker_process``), as spawned ones would (``ORCHESTRATOR_PLUGINS``
    included). Python keeps one fork server per process, and the preload list set here is that
    server's (one already started by other code keeps its own; the trainers then import this module
    themselves)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def _submit(pool: Executor, experiment: UpdateExperiment, method: CompatibilityMethod, **kwargs) -> Future:
    log.info("training %s%s", method.name, " (aligned to its parent)" if kwargs.get("parent") is not None else "")
    return pool.submit(_train, experiment, method.name, method.params.model_dump(mode="json"), kwargs)


def _train(experiment: UpdateExperiment, method_name: str, params: dict[str, Any],
           kwargs: dict[str, Any]) -> tuple[CompatibleModel, float]:
    """One training (runs in a pool process or in this one): the method is rebuilt by name. The
    model comes back on the CPU, so that a pool process trained on a GPU hands over plain tensors,
    with the training's wall time in seconds."""
    started = time.perf_counter()
    model = experiment.train(create_method(method_name, params), **kwargs).cpu()
    return model, time.perf_counter() - started
