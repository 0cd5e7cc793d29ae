"""The plain PyTorch training loop of one generation, shared by local runs and Ray Train workers.

``train_one_epoch`` is the unit the Ray Train adapter calls per epoch (with a DDP-wrapped
``forward_model`` and a sharded loader); ``train_generation`` is the whole local loop with the
method's hooks around it.
"""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from orchestrator.methods.base import CompatibilityMethod, TrainContext
from orchestrator.models.bundle import CompatibleModel
from orchestrator.training.config import TrainConfig
from orchestrator.training.health import HealthMonitor, TrainingUnhealthy
from orchestrator.training.optim import build_optimizer, set_learning_rate

EpochCallback = Callable[[int, dict[str, float]], None]


def freeze(model: CompatibleModel) -> CompatibleModel:
    """Put a parent generation in eval mode with no trainable parameters (BatchNorm stats fixed)."""
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def train_one_epoch(
    method: CompatibilityMethod,
    ctx: TrainContext,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    forward_model: nn.Module | None = None,
) -> dict[str, float]:
    """One pass over ``loader`` minimising the sum of ``method.loss`` terms.

    The frozen parent (``ctx.old_model``) sees exactly the same augmented batch as the new model.
    ``forward_model`` is the module to call for the new model (a DDP wrapper under Ray Train);
    it defaults to ``ctx.new_model``. Returns sample-weighted means: ``loss`` (the total) and
    ``loss/<term>`` for every named term, plus ``samples`` (count).
    """
    model = forward_model if forward_model is not None else ctx.new_model
    model.train()
    sums: dict[str, float] = defaultdict(float)
    seen = 0
    for images, labels, _ids in loader:
        images = images.to(ctx.device, non_blocking=True)
        labels = labels.to(ctx.device, non_blocking=True)
        old_out = None
        if ctx.old_model is not None:
            with torch.no_grad():
                old_out = ctx.old_model(images)
        new_out = model(images)
        terms = method.loss(new_out, old_out, labels, ctx)
        if not terms:
            raise RuntimeError(f"method {method.name!r} returned no loss terms")
        total = torch.stack([value for value in terms.values()]).sum()
        if not torch.isfinite(total):
            raise FloatingPointError(
                f"method {method.name!r}: non-finite loss at epoch {ctx.epoch}: "
                + ", ".join(f"{k}={v.item():.4g}" for k, v in terms.items())
            )
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        if config.grad_clip_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip_norm)
        optimizer.step()
        batch = labels.shape[0]
        seen += batch
        sums["loss"] += total.item() * batch
        for name, value in terms.items():
            sums[f"loss/{name}"] += value.item() * batch
    if seen == 0:
        raise ValueError("train_one_epoch: the loader yielded no batch (dataset smaller than batch size?)")
    stats = {name: total / seen for name, total in sums.items()}
    stats["samples"] = float(seen)
    return stats


def make_train_loader(
    data: Dataset, config: TrainConfig, epoch: int, rank: int = 0, world_size: int = 1
) -> DataLoader:
    """Shuffled loader of one epoch, reproducible from ``config.seed`` and ``epoch``.

    With ``world_size`` > 1 each rank reads its own shard through a ``DistributedSampler``
    (same seed on every rank, re-shuffled per epoch). The last incomplete batch is dropped when
    at least one full batch exists.
    """
    drop_last = len(data) // world_size >= config.batch_size
    if world_size > 1:
        sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True,
                                     seed=config.seed, drop_last=True)
        sampler.set_epoch(epoch)
        return DataLoader(data, batch_size=config.batch_size, sampler=sampler, drop_last=drop_last)
    generator = torch.Generator().manual_seed(config.seed * 10_007 + epoch)
    return DataLoader(data, batch_size=config.batch_size, shuffle=True, drop_last=drop_last, generator=generator)


def train_generation(
    method: CompatibilityMethod,
    model: CompatibleModel,
    train_data: Dataset,
    plain_data: Dataset,
    config: TrainConfig,
    old_model: CompatibleModel | None = None,
    device: torch.device | str = "cpu",
    on_epoch_end: EpochCallback | None = None,
    health: HealthMonitor | None = None,
) -> list[dict[str, float]]:
    """Train ``model`` in place with ``method`` for ``config.epochs`` epochs (none for a method that
    trains no encoder: ``model`` is frozen and only the end hook fits its map).

    train_data: items ``(image, label, id)`` with augmentation, used for the gradient steps.
    plain_data: the same items without augmentation, used by the method's hooks (prototypes).
    old_model:  the parent generation (frozen here), required when ``method.requires_parent``.
    health:     the generation's health check (``orchestrator.training.health``), judged after
                every epoch and after the method's end hook; a stop raises ``TrainingUnhealthy``
                (its one line) and leaves the model as trained so far.
    Returns one stats dict per epoch (``epoch``, ``lr``, ``seconds``, ``loss``, ``loss/<term>``).
    """
    if method.requires_parent and old_model is None:
        raise ValueError(f"method {method.name!r} aligns to a parent generation, but no parent was given")
    device = torch.device(device)
    torch.manual_seed(config.seed)
    model.to(device)
    if old_model is not None:
        freeze(old_model.to(device))
    epochs = config.epochs if method.trains_encoder else 0
    if not method.trains_encoder:
        freeze(model)
    ctx = TrainContext(
        new_model=model,
        old_model=old_model,
        train_data=plain_data,
        num_classes=model.num_classes,
        device=device,
        epochs=epochs,
        batch_size=max(config.batch_size, 256),
    )
    optimizer = build_optimizer(model, config) if epochs else None
    method.on_train_start(ctx)
    history: list[dict[str, float]] = []
    for epoch in range(epochs):
        ctx.epoch = epoch
        started = time.perf_counter()
        method.on_epoch_start(ctx)
        lr = set_learning_rate(optimizer, epoch, config)
        stats = train_one_epoch(method, ctx, make_train_loader(train_data, config, epoch), optimizer, config)
        stats.update(epoch=float(epoch), lr=lr, seconds=time.perf_counter() - started)
        stop = None if health is None else health.after_epoch(epoch, stats["loss"], model)
        if health is not None:
            stats.update(health.measured)
        history.append(stats)
        if on_epoch_end is not None:
            on_epoch_end(epoch, stats)
        if stop is not None:
            model.eval()
            raise TrainingUnhealthy(stop.line)
    method.on_train_end(ctx)
    model.eval()
    stop = None if health is None else health.after_training(model, ctx.state)
    if stop is not None:
        raise TrainingUnhealthy(stop.line)
    return history
