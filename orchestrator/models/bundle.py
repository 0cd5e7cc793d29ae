"""One model generation as a single module: encoder, classification head, optional adapters and
training-only auxiliary modules."""
from __future__ import annotations

from typing import Iterable, Mapping

import torch
from torch import nn

from orchestrator.geometry.spaces import Space
from orchestrator.models.outputs import ModelOutput

#: State-dict prefix of the training-only modules (``CompatibleModel.auxiliary``).
AUXILIARY_PREFIX = "auxiliary."
#: The buffer of the class ids a generation was trained on (its own, never taken from another model).
SEEN_CLASSES = "seen_classes"


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
    auxiliary:    named training-only modules of the method (``CompatibilityMethod.build_auxiliary``,
                  e.g. AdvBCT's discriminator). They are part of the module while it trains, so the
                  optimiser, DDP and the epoch checkpoints of a resumable run treat them like any
                  other weight, but never part of a deployed generation: ``deployable_state_dict``
                  leaves them out and a loaded generation has none. ``forward`` never calls them.
    """

    def __init__(
        self,
        encoder: nn.Module,
        head: nn.Module,
        seen_classes: torch.Tensor | Iterable[int],
        adapters: Mapping[str, nn.Module] | None = None,
        auxiliary: Mapping[str, nn.Module] | None = None,
    ):
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.register_buffer(
            SEEN_CLASSES, torch.as_tensor(list(seen_classes) if not torch.is_tensor(seen_classes)
                                            else seen_classes, dtype=torch.long).flatten().clone()
        )
        self.adapters = nn.ModuleDict(dict(adapters or {}))
        self.auxiliary = nn.ModuleDict(dict(auxiliary or {}))

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

    def deployable_state_dict(self) -> dict[str, torch.Tensor]:
        """``state_dict()`` without the training-only ``auxiliary`` modules: what a generation
        checkpoint stores."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith(AUXILIARY_PREFIX)}

    def load_generation_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Start from a deployed generation's weights (``deployable_state_dict`` of another model,
        e.g. the parent of a fine-tuned generation), strictly, except that this model keeps its own
        ``seen_classes`` (the classes IT trains on: a fine-tuned generation usually sees more than
        its parent) and its own ``auxiliary`` modules' initialisation (e.g. a new AdvBCT generation
        started from its parent's weights keeps its fresh discriminator)."""
        weights = {k: v for k, v in state.items() if k != SEEN_CLASSES}
        missing, unexpected = self.load_state_dict(weights, strict=False)
        missing = [k for k in missing if not k.startswith(AUXILIARY_PREFIX) and k != SEEN_CLASSES]
        if missing or unexpected:
            raise RuntimeError(f"load_generation_weights: missing keys {missing}, unexpected keys {list(unexpected)}")
