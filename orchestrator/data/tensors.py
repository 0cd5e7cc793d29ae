"""The torch side of labelled images: pixels to the normalised tensors a model takes, one batch
at a time (``to_model_input``) or item by item for a DataLoader (``ImageTensorDataset``)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from orchestrator.data.images import LabeledImages


def to_unit_range(images: torch.Tensor | np.ndarray, image_size: int) -> torch.Tensor:
    """uint8 (B, H, W, 3) → float32 (B, 3, S, S) in [0, 1]: ÷255, then a bilinear (antialiased)
    resize to S × S when the stored size differs."""
    batch = torch.as_tensor(images).permute(0, 3, 1, 2).to(torch.float32).div_(255.0)
    if batch.shape[2:] != (image_size, image_size):
        batch = F.interpolate(batch, size=(image_size, image_size), mode="bilinear", align_corners=False,
                              antialias=True)
    return batch


def to_model_input(images: torch.Tensor | np.ndarray, image_size: int, mean: Sequence[float],
                   std: Sequence[float]) -> torch.Tensor:
    """uint8 (B, H, W, 3) → the normalised float32 (B, 3, S, S) a model takes (no augmentation);
    item for item what ``ImageTensorDataset`` yields without augmentation."""
    batch = to_unit_range(images, image_size)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return (batch - mean_t) / std_t


class ImageTensorDataset(Dataset):
    """Items `(image float32 (3, S, S), label int64, id int64)` from a `LabeledImages`.

    Per item: pixels / 255 -> bilinear (antialiased) resize to S x S when the stored size differs ->
    optional augmentation -> (x - mean) / std per channel.

    Augmentation (when `augment`): zero-pad by `crop_padding` pixels on every side, take a random S x S
    crop, flip horizontally with probability 1/2 -- torchvision's RandomCrop(S, padding) +
    RandomHorizontalFlip, as in the d-Simplex code (stationary_dsimplex.md §7.1); HBCT states no
    augmentation (hbct.md §15.9). Randomness comes from torch's global generator, which DataLoader
    seeds per worker.

    Decision: the resize happens per item, not once up-front, because an up-front copy at ViT size
    (50k CIFAR images at 224 x 224) would need gigabytes; images are resized to a square S x S
    (every supported dataset is square). Decision: `crop_padding` defaults to S // 8, i.e. the usual
    4 pixels at S = 32, scaled with the image size.
    """

    def __init__(
        self,
        data: LabeledImages,
        image_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        augment: bool = False,
        crop_padding: int | None = None,
    ) -> None:
        if not isinstance(image_size, int) or image_size < 1:
            raise ValueError(f"image_size: expected a positive int, got {image_size!r}")
        if len(mean) != 3:
            raise ValueError(f"mean: expected 3 per-channel values, got {list(mean)!r}")
        if len(std) != 3 or min(std) <= 0:
            raise ValueError(f"std: expected 3 positive per-channel values, got {list(std)!r}")
        padding = image_size // 8 if crop_padding is None else crop_padding
        if padding < 0:
            raise ValueError(f"crop_padding: expected >= 0, got {crop_padding!r}")
        self.data = data
        self.image_size = image_size
        self.augment = augment
        self.crop_padding = padding
        self._images = torch.from_numpy(data.images)  # (N, H, W, 3) uint8, shares memory
        self._mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self._std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        image = to_unit_range(self._images[index : index + 1], self.image_size)[0]  # (3, S, S)
        if self.augment:
            image = self._random_crop_flip(image)
        image = (image - self._mean) / self._std
        label = torch.tensor(self.data.labels[index], dtype=torch.int64)
        item_id = torch.tensor(self.data.ids[index], dtype=torch.int64)
        return image, label, item_id

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """The items of ``indices`` (what a DataLoader's batch fetch asks for): without augmentation
        converted as one batch (the same values as item by item, for a quarter of the CPU
        time per item on 32 x 32 images); with it item by item, so that each item draws its crop and flip
        from torch's generator in the same order as ``__getitem__`` calls would."""
        if self.augment:
            return [self[index] for index in indices]
        rows = np.asarray(indices, dtype=np.int64)
        images = to_unit_range(self._images[torch.from_numpy(rows)], self.image_size)
        images = (images - self._mean) / self._std
        labels = torch.from_numpy(self.data.labels[rows].astype(np.int64))
        ids = torch.from_numpy(self.data.ids[rows].astype(np.int64))
        return list(zip(images.unbind(0), labels.unbind(0), ids.unbind(0)))

    def _random_crop_flip(self, image: torch.Tensor) -> torch.Tensor:
        """(3, S, S) -> (3, S, S): random crop of the zero-padded image, then a random horizontal flip."""
        p, size = self.crop_padding, self.image_size
        if p:
            padded = F.pad(image, (p, p, p, p))
            top, left = (int(v) for v in torch.randint(0, 2 * p + 1, (2,)))
            image = padded[:, top : top + size, left : left + size]
        if bool(torch.rand(()) < 0.5):
            image = image.flip(-1)
        return image.contiguous()
