"""``independent``: a generation trained with its base loss only (φ_o, and the reference φ_*)."""
from __future__ import annotations

import torch

from orchestrator.methods.common import SupervisedMethod
from orchestrator.methods.descriptions import IndependentDescription
from orchestrator.methods.registry import register_method
from orchestrator.models.outputs import ModelOutput


@register_method
class Independent(IndependentDescription, SupervisedMethod):
    """No compatibility objective: L = CE (HBCT eq. 8). Trains old models and the φ_* reference
    that P_com / P_up normalise by; searching its queries against an older gallery is expected
    to fail (cross-test far below the old self-test)."""

    def loss(self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx) -> dict[str, torch.Tensor]:
        return {"base": self.base_loss(new, labels)}
