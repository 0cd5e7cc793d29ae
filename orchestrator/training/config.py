"""Typed training settings of one generation (optimiser, schedule, epochs, batch size)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator import limits


class TrainConfig(BaseModel):
    """How one generation's encoder is optimised.

    The defaults are the HBCT ResNet18 recipe (SGD, lr 0.1, momentum 0.9, weight decay 5e-4,
    cosine annealing, batch 128; hbct.md §10) with few epochs, sized for the bundled dataset.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(10, ge=1, le=limits.MAX_EPOCHS)
    batch_size: int = Field(128, ge=2, le=limits.MAX_BATCH_SIZE)
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(5e-4, ge=0)
    schedule: Literal["cosine", "constant"] = "cosine"
    min_lr: float = Field(0.0, ge=0)
    warmup_epochs: int = Field(0, ge=0, le=limits.MAX_EPOCHS)
    grad_clip_norm: float | None = Field(None, gt=0)
    augment: bool = True
    seed: int = 0
