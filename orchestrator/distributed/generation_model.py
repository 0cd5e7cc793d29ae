"""The generation a gallery step's workers embed with, as it travels to them: a few names and
numbers, no weights (each worker loads the checkpoint itself, sha256-checked). Light on purpose:
every worker process of the step unpickles it, and a finisher, which never runs the model, must
not import torch or Ray Data to do so."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.data.gallery_sources import ImageFormat

if TYPE_CHECKING:
    from orchestrator.shard_update import PixelEmbedder


@dataclass(frozen=True)
class GenerationModel:
    """The generation the workers embed with: its checkpoint (sha256-checked when loaded), its
    space and curvature, and the preprocessing (image size, normalisation, the source's format)."""

    name: str
    checkpoint_uri: str
    sha256: str
    space: str
    curv: float
    image_size: int
    image_format: ImageFormat
    mean: tuple[float, ...]
    std: tuple[float, ...]
    storage_options: dict | None = None

    @classmethod
    def from_checkpoint(cls, name: str, checkpoint_uri: str, sha256: str, image_size: int, image_format: ImageFormat,
                        mean, std, storage_options: dict | None = None) -> GenerationModel:
        """The generation saved at ``checkpoint_uri``, its space and curvature read from its card."""
        from orchestrator.models.checkpoint import load_card

        card = load_card(checkpoint_uri, storage_options)
        return cls(name, checkpoint_uri, sha256, card.space, float(card.curv), image_size, image_format,
                   tuple(mean), tuple(std), storage_options)

    def embedder(self, device: str) -> PixelEmbedder:
        from orchestrator.methods.loading import load_generation
        from orchestrator.shard_update import PixelEmbedder

        model, _card = load_generation(self.checkpoint_uri, expected_sha256=self.sha256, map_location=device,
                                       storage_options=self.storage_options)
        return PixelEmbedder(model, self.image_size, self.mean, self.std, device)
