"""One generation's training as plain PyTorch: the job description and the per-epoch session.

``GenerationJob`` is everything needed to train one generation, as JSON-able data, so it travels to
Ray Train workers and Tune trials alike. ``GenerationTraining`` is the loop body both run: load the
training items, build the model (seeded with ``job.seed``), load the frozen parent from its
checkpoint (sha256 verified), then one ``train_one_epoch`` per epoch with the method's hooks
around it. The Ray adapters (``orchestrator.distributed.train``, ``orchestrator.tuning.trial``)
only add what is theirs: checkpoints, DDP, reporting. No Ray import here.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from orchestrator.data import ImageTensorDataset, load_source
from orchestrator.methods import TrainContext, create_method
from orchestrator.methods.loading import load_generation
from orchestrator.methods.posthoc import FIT_SECONDS as POSTHOC_FIT_SECONDS
from orchestrator.methods.posthoc import HISTORY as POSTHOC_HISTORY
from orchestrator.models.checkpoint import CheckpointCard, save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.config import HealthSpec, TrainConfig
from orchestrator.training.health import HealthMonitor, HealthStop, health_sample
from orchestrator.training.loop import freeze, make_train_loader, train_one_epoch
from orchestrator.training.optim import build_optimizer, set_learning_rate


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
    health: the generation's ``HealthSpec`` (as a dict); None: not checked.
    health_source, health_options: the evaluation split's source and loader keyword arguments,
              which the health check's own-retrieval sample is drawn from (``health_sample``);
              None: no own-retrieval check (the loss is still judged).
    encoder_uri, encoder_sha256: a generation checkpoint whose encoder (backbone, projection, lift)
              this generation takes unchanged (``encoder_from``; sha256 verified); None: built from
              ``encoder`` (random init or ``pretrained``).
    pairs_source, pairs_options: the source and loader keyword arguments of the items a post-hoc
              map's paired sample is drawn from (the gallery's split); None: the training items.
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
    health: dict[str, Any] | None = None
    health_source: str | None = None
    health_options: dict[str, Any] = field(default_factory=dict)
    encoder_uri: str | None = None
    encoder_sha256: str | None = None
    pairs_source: str | None = None
    pairs_options: dict[str, Any] = field(default_factory=dict)


class GenerationTraining:
    """The state of one generation's training: data, method, model, frozen parent, optimiser.

    Construction loads the training items, seeds torch with ``job.seed`` and builds the model
    (so two runs of the same job start from the same weights), and loads the parent. A caller
    may then restore ``model`` / ``optimizer`` from a checkpoint and wrap ``model`` (DDP) before
    ``start()``; then ``train_epoch(epoch)`` for each epoch and ``finish()`` once.
    """

    def __init__(self, job: GenerationJob, device: torch.device | str = "cpu"):
        self.job = job
        self.device = torch.device(device)
        self.training = TrainConfig(**job.training)
        self.method = create_method(job.method, job.method_params)
        self.encoder_config = EncoderConfig(**job.encoder)
        images = load_source(job.data_source, **job.data_options)
        if job.train_ids is not None:
            images = images.subset(np.flatnonzero(np.isin(images.ids, np.asarray(job.train_ids))))
        self.train_data = ImageTensorDataset(images, job.image_size, job.mean, job.std, augment=self.training.augment)
        self.plain_data = ImageTensorDataset(images, job.image_size, job.mean, job.std)

        torch.manual_seed(job.seed)
        self.model = self.method.build_model(self.encoder_config, job.num_classes,
                                             torch.as_tensor(np.unique(images.labels)))
        if job.encoder_uri is not None:
            given, _card = load_generation(job.encoder_uri, expected_sha256=job.encoder_sha256,
                                           storage_options=job.storage_options)
            self.model.encoder.load_state_dict(given.encoder.state_dict())
        if not self.method.trains_encoder:
            freeze(self.model)  # the given encoder, lift and head stay as they are; only the map is fitted
        parent = None
        if job.parent_uri is not None:
            parent, _card = load_generation(job.parent_uri, expected_sha256=job.parent_sha256,
                                            storage_options=job.storage_options)
            if job.init_from_parent:
                self.model.load_generation_weights(parent.deployable_state_dict())
        if job.replaces:
            parent = copy.deepcopy(self.model)
            parent.auxiliary.clear()  # the frozen starting point is a generation, not a training state
        if parent is not None:
            freeze(parent.to(self.device))
        self.parent = parent
        self.optimizer = build_optimizer(self.model, self.training) if self.method.trains_encoder else None
        self.ctx: TrainContext | None = None
        self.forward_model: nn.Module = self.model
        self.health: HealthMonitor | None = None
        self._train_classes = np.unique(images.labels)

    @property
    def epochs(self) -> int:
        """Training epochs: the training settings' for a method that trains its encoder, else 0."""
        return self.training.epochs if self.method.trains_encoder else 0

    def watch_health(self, first_loss: float | None = None) -> HealthMonitor | None:
        """Build the job's ``HealthMonitor`` (None when the job has no ``health``): its sample is
        drawn from the evaluation split (``job.health_source``) on this generation's classes.
        ``first_loss``: the first epoch's loss when resuming after it. Call on the rank that judges."""
        job = self.job
        if job.health is None:
            return None
        spec = HealthSpec(**job.health)
        sample = None
        if spec.enabled and job.health_source is not None:
            images = load_source(job.health_source, **job.health_options)
            sample = health_sample(images, self._train_classes, spec.sample, job.image_size, job.mean, job.std)
        from_scratch = not (job.init_from_parent or job.replaces or self.encoder_config.pretrained)
        self.health = HealthMonitor(spec, job.name, self.epochs, self.training.warmup_epochs, sample,
                                    check_loss=from_scratch, device=self.device, first_loss=first_loss)
        return self.health

    def check_health(self, epoch: int, stats: dict[str, float]) -> HealthStop | None:
        """The health judgement after ``epoch`` (``HealthMonitor.after_epoch``); None without a monitor."""
        return None if self.health is None else self.health.after_epoch(epoch, stats["loss"], self.model)

    def check_health_at_end(self) -> HealthStop | None:
        """After ``finish()``: a generation that trains no encoder is judged on its map's fit."""
        if self.health is None or self.ctx is None:
            return None
        return self.health.after_training(self.model, self.ctx.state)

    def start(self, forward_model: nn.Module | None = None) -> None:
        """Create the method's context and run its ``on_train_start`` hook. ``forward_model`` is
        the module called for the new model (a DDP wrapper under Ray Train); default ``model``."""
        self.forward_model = forward_model if forward_model is not None else self.model
        self.model.to(self.device)
        pair_data = None
        if self.job.pairs_source is not None:
            pair_data = ImageTensorDataset(load_source(self.job.pairs_source, **self.job.pairs_options),
                                           self.job.image_size, self.job.mean, self.job.std)
        self.ctx = TrainContext(new_model=self.model, old_model=self.parent, train_data=self.plain_data,
                                num_classes=self.model.num_classes, device=self.device,
                                epochs=self.epochs, batch_size=max(self.training.batch_size, 256),
                                pair_data=pair_data)
        self.method.on_train_start(self.ctx)

    def train_epoch(self, epoch: int, rank: int = 0, world_size: int = 1) -> dict[str, float]:
        """One epoch (0-based): the method's epoch hook, the scheduled learning rate, one pass over
        this rank's shard of the data. Returns ``train_one_epoch``'s stats plus ``epoch`` and ``lr``."""
        if self.ctx is None:
            raise RuntimeError("GenerationTraining.train_epoch before start()")
        self.ctx.epoch = epoch
        self.method.on_epoch_start(self.ctx)
        lr = set_learning_rate(self.optimizer, epoch, self.training)
        loader = make_train_loader(self.train_data, self.training, epoch, rank=rank, world_size=world_size)
        stats = train_one_epoch(self.method, self.ctx, loader, self.optimizer, self.training,
                                forward_model=self.forward_model)
        return {**stats, "epoch": epoch, "lr": lr}

    def finish(self) -> None:
        """The method's ``on_train_end`` hook (e.g. the adapter stage of λ-orthogonality)."""
        if self.ctx is None:
            raise RuntimeError("GenerationTraining.finish before start()")
        self.method.on_train_end(self.ctx)

    def fit_metrics(self) -> dict[str, float]:
        """After ``finish()``, a post-hoc generation's fit (``orchestrator.methods.posthoc``): ``loss``
        (its map's squared error on the paired sample), ``loss/mean_map`` (the constant map's, the
        targets' variance) and ``fit_seconds``; empty for a method that trains its encoder."""
        history = self.ctx.state.get(POSTHOC_HISTORY) if self.ctx is not None else None
        if not history:
            return {}
        return {"loss": history[-1]["loss"], "loss/mean_map": history[0]["loss"],
                "fit_seconds": float(self.ctx.state[POSTHOC_FIT_SECONDS])}

    def save(self, uri: str | None = None, extra: dict[str, Any] | None = None) -> CheckpointCard:
        """Write the trained generation (safetensors + card) to ``uri`` (default ``job.output_uri``)."""
        return save_generation(self.model.cpu(), self.method, self.encoder_config, uri or self.job.output_uri,
                               name=self.job.name, parent=self.job.parent_name, extra=extra,
                               storage_options=self.job.storage_options)
