"""Optimiser and learning-rate schedule built from a ``TrainConfig``."""
from __future__ import annotations

import math

import torch
from torch import nn

from orchestrator.training.config import TrainConfig


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD (Nesterov off), Adam or AdamW over the parameters that require gradients."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("build_optimizer: the model has no trainable parameters")
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                               weight_decay=config.weight_decay)
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


def learning_rate_factor(epoch: int, config: TrainConfig) -> float:
    """Multiplier of ``config.lr`` during ``epoch`` (0-based): linear warm-up, then cosine or constant.

    Cosine annealing runs from ``lr`` at the first post-warm-up epoch down towards ``min_lr``
    (reached after the last epoch), stepped once per epoch.
    """
    if epoch < config.warmup_epochs:
        return (epoch + 1) / (config.warmup_epochs + 1)
    if config.schedule == "constant":
        return 1.0
    span = max(1, config.epochs - config.warmup_epochs)
    progress = (epoch - config.warmup_epochs) / span
    floor = config.min_lr / config.lr
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: torch.optim.Optimizer, epoch: int, config: TrainConfig) -> float:
    """Apply the schedule for ``epoch`` to every parameter group; returns the learning rate used."""
    lr = config.lr * learning_rate_factor(epoch, config)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr
