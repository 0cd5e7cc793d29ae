"""What a model returns for a batch: the pre-lift feature, the embedding in its space, the logits."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    """Outputs of one forward pass over a batch of B inputs.

    features:  (B, d) Euclidean vector right before the space lift. For hyperbolic lifts this is the
               tangent vector at the origin after the sqrt(d) rescale and the norm clip (HBCT §3).
    embedding: the point in the generation's space: (B, d) for euclidean / cosine / poincare,
               (B, d+1) for lorentz (time coordinate first).
    logits:    (B, C) from the classification head, or None when no head was applied.
    """

    features: torch.Tensor
    embedding: torch.Tensor
    logits: torch.Tensor | None = None
