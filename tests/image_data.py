"""Small synthetic image datasets shared by the tests (importable: pytest's pythonpath has tests/)."""
from __future__ import annotations

import torch
from torch.utils.data import Dataset


class LabelShiftedImages(Dataset):
    """n random (3, size, size) images; item i has label i % num_classes and its pixels are shifted
    by ``shift · label`` so that classes are separable. Items are ``(image, label, id)`` with
    id = id_offset + i."""

    def __init__(self, n: int = 32, num_classes: int = 4, seed: int = 0, shift: float = 0.5,
                 size: int = 16, id_offset: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.arange(n) % num_classes
        self.images = torch.randn(n, 3, size, size, generator=generator) + shift * self.labels.view(-1, 1, 1, 1).float()
        self.ids = torch.arange(id_offset, id_offset + n)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i], self.ids[i]
