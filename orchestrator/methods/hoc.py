"""``hoc``: Higher-Order Compatibility, λ·CE + (1−λ)·InfoNCE(old anchor, new contrast set)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.methods.common import SupervisedMethod, require_parent
from orchestrator.methods.descriptions import HOCDescription
from orchestrator.methods.registry import register_method
from orchestrator.models.outputs import ModelOutput


def hoc_infonce(old: torch.Tensor, new: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    """The HOC InfoNCE term as released (stationary_dsimplex.md §5.4), batch mean.

    old, new: (B, d) embeddings of the same inputs; labels (B,).
    s_ij = τ·cos(old_i, new_j); loss_i = −s_ii + logsumexp_j(s_ij · 1[y_j ≠ y_i]).
    Decision: the code version, not eq. 4 — same-class logits (the positive included) are set to
    0, not removed, so each adds exp(0) = 1 to the denominator; this reproduces released numbers.
    """
    sim = tau * F.normalize(old, dim=1) @ F.normalize(new, dim=1).T
    same = labels.unsqueeze(0) == labels.unsqueeze(1)
    negatives = sim.masked_fill(same, 0.0)
    return (-sim.diagonal() + torch.logsumexp(negatives, dim=1)).mean()


@register_method
class HOC(HOCDescription, SupervisedMethod):
    """L = λ·CE + (1 − λ)·InfoNCE (stationary_dsimplex.md eq. 3) with a trainable classifier, as
    HBCT uses HOC as a baseline (its fixed d-Simplex is the separate ``dsimplex`` method)."""

    def loss(self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx) -> dict[str, torch.Tensor]:
        old = require_parent(old, self.name)
        lam = self.params.lam
        return {
            "base": lam * self.base_loss(new, labels),
            "infonce": (1.0 - lam) * hoc_infonce(old.embedding, new.embedding, labels, self.params.tau),
        }
