"""``l2``: the ℓ2 feature-regression baseline (HBCT §13)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.geometry.spaces import Space
from orchestrator.methods.common import SupervisedMethod, require_parent
from orchestrator.methods.descriptions import L2RegressionDescription
from orchestrator.methods.registry import register_method
from orchestrator.models.outputs import ModelOutput


@register_method
class L2Regression(L2RegressionDescription, SupervisedMethod):
    """L = CE + λ · mean_i ‖e_n(x_i) − e_o(x_i)‖², on the same input.

    Decision (open in hbct.md §13): in the cosine space both embeddings are L2-normalised first,
    as OpenCompatible's 'l2' does, so the term matches what cosine retrieval compares; in the
    euclidean and lorentz spaces the raw feature vectors (before the lift) are regressed.
    """

    def loss(self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx) -> dict[str, torch.Tensor]:
        old = require_parent(old, self.name)
        if self.space is Space.COSINE:
            new_vec, old_vec = F.normalize(new.embedding, dim=1), F.normalize(old.embedding, dim=1)
        else:
            new_vec, old_vec = new.features, old.features
        if new_vec.shape != old_vec.shape:
            raise ValueError(f"l2: new and old embeddings differ in shape: {tuple(new_vec.shape)} vs {tuple(old_vec.shape)}")
        regression = (new_vec - old_vec).pow(2).sum(dim=1).mean()
        return {"base": self.base_loss(new, labels), "l2": self.params.lam * regression}
