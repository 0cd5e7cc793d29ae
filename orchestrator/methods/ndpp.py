"""``ndpp``: Neighbour-Driven Prototype Perturbation (prototype_perturbation.md §5)."""
from __future__ import annotations

from orchestrator.methods.base import TrainContext
from orchestrator.methods.descriptions import NDPPDescription
from orchestrator.methods.prototypes import (
    OLD_PROTOTYPES,
    POSITIVES,
    PRESENT,
    PerturbedPrototypeMethod,
    neighbour_repulsion,
)
from orchestrator.methods.registry import register_method

PSEUDO_OLD = "ndpp/pseudo_old"
OLD_REPULSION = "ndpp/r_old"
NEW_REPULSION = "ndpp/r_new"


@register_method
class NDPP(NDPPDescription, PerturbedPrototypeMethod):
    """L = CE + λ·Eq. 6 with NDPP positives (Algorithm 1).

    Before training: p̂_o = p_o + α1 r_o, r_o the repulsion of p_o from its K most similar old
    prototypes of other classes (Eqs. 4-5). At the start of every epoch t: the new prototypes p_n,
    r_t the repulsion of p̂_o from its K most similar new prototypes of other classes (Eq. 7), and
    positive p̂_{o-t} = p_o + α1 r_o + α2 r_t (Eq. 8).
    Decision (spec §13.3): Eq. 8 by default, i.e. r_t is recomputed from the fixed p̂_o each epoch;
    ``cumulative=True`` follows Algorithm 1 line 13 (p̂ accumulates, and Eq. 7 uses the previous
    epoch's p̂). Decision (spec §13.6): the literal algorithm (r_t at epoch 0 too) by default.
    """

    def on_train_start(self, ctx: TrainContext) -> None:
        super().on_train_start(ctx)
        old_prototypes, present = ctx.state[OLD_PROTOTYPES], ctx.state[PRESENT]
        r_old = neighbour_repulsion(old_prototypes, old_prototypes, self.params.k, exclude_self=True,
                                    candidate_mask=present)
        ctx.state[OLD_REPULSION] = r_old
        ctx.state[PSEUDO_OLD] = old_prototypes + self.params.alpha_old * r_old
        ctx.state[POSITIVES] = ctx.state[PSEUDO_OLD]

    def on_epoch_start(self, ctx: TrainContext) -> None:
        params = self.params
        if not params.new_perturbation or (params.skip_first_epoch_new and ctx.epoch == 0):
            ctx.state[POSITIVES] = ctx.state[PSEUDO_OLD]
            return
        anchors = ctx.state[POSITIVES] if params.cumulative else ctx.state[PSEUDO_OLD]
        r_new = neighbour_repulsion(anchors, self.new_prototypes(ctx), params.k, exclude_self=True,
                                    candidate_mask=ctx.state[PRESENT])
        ctx.state[NEW_REPULSION] = r_new
        ctx.state[POSITIVES] = anchors + params.alpha_new * r_new
