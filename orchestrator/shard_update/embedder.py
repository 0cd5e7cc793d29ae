"""A generation's encoder applied to decoded gallery images, as the gallery step applies it."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from orchestrator.data.tensors import to_model_input
from orchestrator.geometry.geometry import Geometry


class PixelEmbedder:
    """uint8 pixels (B, S, S, 3) → (embedding (B, D) float32 in the generation's space,
    uncertainty (B,) float32: ``Geometry.uncertainty``, HBCT 1 − ‖h_s‖/h_t for Lorentz points,
    NaN for flat spaces).

    model: a loaded ``CompatibleModel`` (``methods.loading.load_generation``), put on ``device`` in eval
    mode; the preprocessing is ``data.tensors.to_model_input``, the one a local run uses.
    """

    def __init__(self, model, image_size: int, mean: Sequence[float], std: Sequence[float],
                 device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.geometry = Geometry(model.space, model.curv)
        self.image_size, self.mean, self.std = image_size, tuple(mean), tuple(std)

    @torch.no_grad()
    def __call__(self, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        batch = to_model_input(pixels, self.image_size, self.mean, self.std).to(self.device)
        embedding = self.model.encoder(batch).embedding.float()
        uncertainty = self.geometry.uncertainty(embedding)
        return (embedding.cpu().numpy().astype(np.float32, copy=False),
                uncertainty.cpu().numpy().astype(np.float32, copy=False))
