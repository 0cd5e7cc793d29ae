"""``odpp``: Optimisation-Driven Prototype Perturbation (prototype_perturbation.md §6)."""
from __future__ import annotations

import torch

from orchestrator.methods.base import TrainContext
from orchestrator.methods.descriptions import ODPPDescription
from orchestrator.methods.prototypes import (
    OLD_PROTOTYPES,
    POSITIVES,
    PRESENT,
    PerturbedPrototypeMethod,
    optimise_odpp_perturbations,
)
from orchestrator.methods.registry import register_method

PERTURBATIONS = "odpp/r"


@register_method
class ODPP(ODPPDescription, PerturbedPrototypeMethod):
    """L = CE + λ·Eq. 6 with ODPP positives p̂ = p_o + r (Eq. 10, Algorithm 2).

    Before training r (zero-initialised) minimises Eq. 9; at the start of every epoch the new
    prototypes p_n are recomputed and r, warm-started from its previous value, minimises Eq. 11.
    Decision (spec §13.11): Algorithm 2's line 7 "p̂_n = p_n + r" is read as p̂ = p_o + r.
    Decision: ODPP-old (``new_term=False``) optimises Eq. 9 once, before training, and keeps those
    positives (Eq. 9 does not depend on the new model), skipping the per-epoch p_n pass.
    The pairs of the inner optimisation at stage s (0 before training, epoch + 1 afterwards) come
    from a generator seeded with (seed, s), so runs and resumed runs draw the same pairs.
    """

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
