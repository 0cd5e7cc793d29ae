"""One model generation as a single module: encoder, classification head, optional adapters."""
from __future__ import annotations

from typing import Iterable, Mapping

import torch
from torch import nn

from orchestrator.geometry.spaces import Space
from orchestrator.models.outputs import ModelOutput


class CompatibleModel(nn.Module):
    """Encoder + head (+ adapters) of one generation, saved and loaded as one state dict.

    encoder:      maps images (B, 3, H, W) to a ``ModelOutput`` (features, embedding); carries the
                  space lift, so ``space`` and ``curv`` are the encoder's.
    head:         maps the embedding to logits (B, C) for the base classification loss.
    seen_classes: the class ids this generation was trained on (a buffer, saved with the weights);
                  BCT uses it to know which rows of an old classifier are real.
    adapters:     named extra modules trained after the encoder, e.g. λ-orthogonality's
                  ``backward`` (new → old space) and ``forward_map`` (old → aligned space) maps,
                  or FCT's ``forward_map`` alone (parent's raw space → this generation's)
                  (``forward`` is taken by ``nn.Module``).
    """

    def __init__(
        self,
        encoder: nn.Module,
        head: nn.Module,
        seen_classes: torch.Tensor | Iterable[int],
        adapters: Mapping[str, nn.Module] | None = None,
    ):
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.register_buffer(
            "seen_classes", torch.as_tensor(list(seen_classes) if not torch.is_tensor(seen_classes)
                                            else seen_classes, dtype=torch.long).flatten().clone()
        )
        self.adapters = nn.ModuleDict(dict(adapters or {}))

    @property
    def space(self) -> Space:
        return self.encoder.lift.space

    @property
    def curv(self) -> float:
        """Curvature magnitude of the embedding space, as a Python float."""
        curv = self.encoder.lift.curv
        return float(curv.detach()) if torch.is_tensor(curv) else float(curv)

    @property
    def num_classes(self) -> int:
        return int(self.head.num_classes)

    def forward(self, images: torch.Tensor) -> ModelOutput:
        """images (B, 3, H, W) → ModelOutput(features (B, d), embedding, logits (B, C))."""
        out = self.encoder(images)
        out.logits = self.head(out.embedding)
        return out
