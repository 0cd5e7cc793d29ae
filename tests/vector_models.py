"""A timm-free stand-in model for loss tests: a linear projection + a method's space lift on flat
input vectors (importable: pytest's pythonpath has tests/)."""
from __future__ import annotations

import torch
from torch import nn

from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.outputs import ModelOutput


class VectorEncoder(nn.Module):
    """Linear projection + space lift on flat input vectors (stands in for the timm encoder)."""

    def __init__(self, in_dim: int, embed_dim: int, lift: nn.Module):
        super().__init__()
        self.proj = nn.Linear(in_dim, embed_dim)
        self.lift = lift

    def forward(self, x: torch.Tensor) -> ModelOutput:
        features, embedding = self.lift(self.proj(x))
        return ModelOutput(features, embedding)


def vector_model(method, in_dim: int, embed_dim: int, num_classes: int, seed: int = 0) -> CompatibleModel:
    """A ``CompatibleModel`` of ``method`` (its lift and head) over a ``VectorEncoder``."""
    torch.manual_seed(seed)
    encoder = VectorEncoder(in_dim, embed_dim, method.build_lift())
    return CompatibleModel(encoder, method.build_head(embed_dim, num_classes), seen_classes=range(num_classes))
