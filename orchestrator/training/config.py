"""Typed training settings of one generation (optimiser, schedule, epochs, batch size)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator import limits


class TrainConfig(BaseModel):
    """How one generation's encoder is optimised.

    The defaults are the HBCT ResNet18 recipe (SGD, lr 0.1, momentum 0.9, weight decay 5e-4,
    cosine annealing, batch 128; hbct.md §10) with few epochs, sized for the bundled dataset.

    epochs:         passes over the training items.
    batch_size:     items per gradient step (per worker under Ray Train).
    optimizer:      sgd (with ``momentum``), adam or adamw.
    lr:             the peak learning rate.
    momentum:       SGD momentum.
    weight_decay:   L2 weight decay of the optimiser.
    schedule:       cosine (annealed from ``lr`` towards ``min_lr`` after the warm-up) or constant.
    min_lr:         the learning rate the cosine schedule ends at.
    warmup_epochs:  epochs of linear warm-up before the schedule.
    grad_clip_norm: clip the gradient's global norm to this value; None does not clip.
    augment:        random crop (zero-padded) and horizontal flip of the training images.
    seed:           the base seed; a generation's seed is derived from it and its name, so the same
                    settings give the same weights.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

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
