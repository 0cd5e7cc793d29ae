"""``hot_refresh``: the regression-alleviating contrastive loss (RACT) of Hot-Refresh."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.methods.common import SupervisedMethod, require_parent
from orchestrator.methods.descriptions import HotRefreshDescription
from orchestrator.methods.registry import register_method
from orchestrator.models.outputs import ModelOutput


def ract_loss(new: torch.Tensor, old: torch.Tensor, labels: torch.Tensor, tau: float) -> torch.Tensor:
    """Hot-Refresh InfoNCE (Zhang et al. 2022; hbct.md §13, OpenCompatible ``contra_reg_free``).

    new, old: (B, d) embeddings of the same B inputs; labels (B,).
    Anchor n_i, positive o_i; negatives o_j and n_j for every j whose label differs from y_i
    (same-class entries are masked out with −inf). Cosine similarities / τ, batch mean.
    """
    new = F.normalize(new, dim=1)
    old = F.normalize(old, dim=1)
    different = labels.unsqueeze(0) != labels.unsqueeze(1)  # (B, B)
    new_old = new @ old.T / tau
    new_new = new @ new.T / tau
    positives = new_old.diagonal().unsqueeze(1)
    neg_old = new_old.masked_fill(~different, float("-inf"))
    neg_new = new_new.masked_fill(~different, float("-inf"))
    logits = torch.cat([positives, neg_old, neg_new], dim=1)
    return (torch.logsumexp(logits, dim=1) - positives.squeeze(1)).mean()


@register_method
class HotRefresh(HotRefreshDescription, SupervisedMethod):
    """L = CE + λ·RACT(φ_n(x), φ_o(x)) (see ``ract_loss``)."""

    def loss(self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx) -> dict[str, torch.Tensor]:
        old = require_parent(old, self.name)
        contrastive = ract_loss(new.embedding, old.embedding, labels, self.params.tau)
        return {"base": self.base_loss(new, labels), "contrastive": self.params.lam * contrastive}
