"""``odpp``: Optimisation-Driven Prototype Perturbation (prototype_perturbation.md §6)."""
from __future__ import annotations

import torch
from pydantic import Field

from orchestrator import limits
from orchestrator.methods.base import TrainContext
from orchestrator.methods.prototypes import (
    OLD_PROTOTYPES,
    POSITIVES,
    PRESENT,
    PerturbedPrototypeMethod,
    PrototypePerturbationParams,
    optimise_odpp_perturbations,
)
from orchestrator.methods.registry import register_method

PERTURBATIONS = "odpp/r"


class ODPPParams(PrototypePerturbationParams):
    """theta_old / theta_new: hinge thresholds θ_old, θ_new (spec §13.12: 0.6 both);
    gamma: weight γ of the old-new term (Eq. 11);
    inner_epochs / inner_lr / inner_batch: the inner SGD over r (50 epochs, lr 1e-3, 1024 pairs);
    max_pairs_per_epoch: cap on the pairs drawn per inner epoch (None = N_img, the number of
    training images, as in the paper; set it for CPU runs);
    new_term: False gives the "ODPP-old" ablation (Eq. 9 only);
    seed: seeds the generator that draws the inner pairs."""

    theta_old: float = 0.6
    theta_new: float = 0.6
    gamma: float = Field(1.0, ge=0)
    inner_epochs: int = Field(50, ge=0, le=limits.MAX_EPOCHS)
    inner_lr: float = Field(1e-3, gt=0)
    inner_batch: int = Field(1024, ge=1, le=limits.MAX_BATCH_SIZE)
    max_pairs_per_epoch: int | None = Field(None, ge=1, le=limits.MAX_STEPS)
    new_term: bool = True
    seed: int = 0


@register_method
class ODPP(PerturbedPrototypeMethod):
    """L = CE + λ·Eq. 6 with ODPP positives p̂ = p_o + r (Eq. 10, Algorithm 2).

    Before training r (zero-initialised) minimises Eq. 9; at the start of every epoch the new
    prototypes p_n are recomputed and r, warm-started from its previous value, minimises Eq. 11.
    Decision (spec §13.11): Algorithm 2's line 7 "p̂_n = p_n + r" is read as p̂ = p_o + r.
    Decision: ODPP-old (``new_term=False``) optimises Eq. 9 once, before training, and keeps those
    positives (Eq. 9 does not depend on the new model), skipping the per-epoch p_n pass.
    The pairs of the inner optimisation at stage s (0 before training, epoch + 1 afterwards) come
    from a generator seeded with (seed, s), so runs and resumed runs draw the same pairs.
    """

    name = "odpp"
    summary = "CE + λ·prototype contrastive loss, positives perturbed by SGD on a hinge over similar prototype pairs"
    Params = ODPPParams

    def on_train_start(self, ctx: TrainContext) -> None:
        super().on_train_start(ctx)
        self._optimise(ctx, torch.zeros_like(ctx.state[OLD_PROTOTYPES]), new_prototypes=None, stage=0)

    def on_epoch_start(self, ctx: TrainContext) -> None:
        if not self.params.new_term:
            return
        self._optimise(ctx, ctx.state[PERTURBATIONS], new_prototypes=self.new_prototypes(ctx), stage=ctx.epoch + 1)

    def _optimise(self, ctx: TrainContext, start: torch.Tensor, new_prototypes: torch.Tensor | None, stage: int) -> None:
        params = self.params
        num_images = len(ctx.train_data)
        pairs = num_images if params.max_pairs_per_epoch is None else min(num_images, params.max_pairs_per_epoch)
        generator = torch.Generator().manual_seed(params.seed * 1_000_003 + stage)
        old_prototypes = ctx.state[OLD_PROTOTYPES]
        r = optimise_odpp_perturbations(
            old_prototypes, start, ctx.state[PRESENT], generator, params.theta_old,
            new_prototypes=new_prototypes, theta_new=params.theta_new, gamma=params.gamma,
            inner_epochs=params.inner_epochs, lr=params.inner_lr, batch_size=params.inner_batch,
            pairs_per_epoch=pairs,
        )
        ctx.state[PERTURBATIONS] = r
        ctx.state[POSITIVES] = old_prototypes + r
