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


STOP = "health/stop"  # the key of a health stop's line in an epoch's reported metrics (and the lineage)
COLLAPSED = "collapsed"  # the same in a Tune trial's report (its outcome in the sweep's table)


class HealthSpec(BaseModel):
    """Whether a generation learns, checked while it trains and when it ends
    (``orchestrator.training.health``; docs/pipelines.md, "Training health"). A generation that
    fails stops at ``train:<gen>`` with one line naming it, the epochs and what was seen; nothing
    of it is evaluated or deployed (``orchestrator run`` exits with code 7).

    enabled:        false: never checked.
    sample:         own retrieval is measured on a seeded class-stratified sample of at most this
                    many items of the evaluation split (``data.eval_split``), of the classes the
                    generation trains on: never training items, and apart from the evaluation's
                    own sample, so no recorded number changes.
    min_epochs:     own retrieval is judged during training from the end of
                    max(min_epochs, ⌈min_fraction × epochs⌉) epochs on (and after any warm-up),
                    once per epoch, and always at the last epoch; the loss once, at the last epoch,
                    when the generation has at least min_epochs epochs.
    min_fraction:   see min_epochs.
    chance_sigmas:  own CMC@1 (leave-one-out, on the sample) below chance + max(chance_margin,
                    chance_sigmas × σ) stops the generation; chance is the CMC@1 a random ranking
                    scores on the sample's labels and σ = √(chance·(1 − chance)/n) the spread of a
                    random ranking's CMC@1 on n items (the floor is at most halfway from chance to 1).
    chance_margin:  see chance_sigmas.
    min_loss_drop:  the last epoch's total loss must be below the first epoch's by at least this
                    fraction of its size; only for a generation that starts from its seeded
                    initialisation (not from its parent's or a pretrained checkpoint, whose loss may
                    start near its floor).
    min_fit_drop:   for a generation that trains no encoder: its fitted map's loss (FCT's F,
                    λ-orthogonality's adapters) must fall by at least this fraction over the fit.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = True
    sample: int = Field(500, ge=10, le=limits.MAX_ITEMS)
    min_epochs: int = Field(3, ge=1, le=limits.MAX_EPOCHS)
    min_fraction: float = Field(0.25, ge=0.0, le=1.0)
    chance_sigmas: float = Field(3.0, ge=0.0, le=100.0)
    chance_margin: float = Field(0.02, ge=0.0, le=1.0)
    min_loss_drop: float = Field(0.01, ge=0.0, lt=1.0)
    min_fit_drop: float = Field(0.01, ge=0.0, lt=1.0)
