"""In-memory labelled image sets and the torch Dataset that feeds them to a model.

`LabeledImages` is what every source in `sources.py` returns and what every scenario in
`scenarios.py` selects from: uint8 HWC pixels, int64 class labels, int64 ids that stay attached to an
item through every subset (retrieval uses them to drop a query's own item from its ranking).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset


@dataclass(frozen=True, eq=False)
class LabeledImages:
    """N labelled RGB images held in memory.

    images:      uint8 (N, H, W, 3), channels last.
    labels:      int64 (N,), class indices in [0, len(class_names)).
    ids:         int64 (N,), unique; an item keeps its id in every subset.
    class_names: list[str], class_names[c] names label c.
    """

    images: np.ndarray
    labels: np.ndarray
    ids: np.ndarray
    class_names: list[str]

    def __post_init__(self) -> None:
        images, labels, ids = self.images, self.labels, self.ids
        if not isinstance(images, np.ndarray) or images.dtype != np.uint8:
            raise ValueError(f"images: expected a uint8 numpy array, got {_describe(images)}")
        if images.ndim != 4 or images.shape[-1] != 3:
            raise ValueError(f"images: expected shape (N, H, W, 3), got {images.shape}")
        n = images.shape[0]
        for name, array in (("labels", labels), ("ids", ids)):
            if not isinstance(array, np.ndarray) or array.dtype != np.int64:
                raise ValueError(f"{name}: expected an int64 numpy array, got {_describe(array)}")
            if array.shape != (n,):
                raise ValueError(f"{name}: expected shape ({n},) to match images, got {array.shape}")
        if not isinstance(self.class_names, list) or not all(isinstance(c, str) for c in self.class_names):
            raise ValueError(f"class_names: expected a list of str, got {self.class_names!r:.200}")
        if n and (labels.min() < 0 or labels.max() >= len(self.class_names)):
            raise ValueError(
                f"labels: values must lie in [0, {len(self.class_names)}) (len(class_names)), "
                f"got range [{labels.min()}, {labels.max()}]"
            )
        if np.unique(ids).size != n:
            raise ValueError(f"ids: must be unique, got {n - np.unique(ids).size} duplicate(s)")

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def num_classes(self) -> int:
        """Number of named classes (the label space), not the number of classes present."""
        return len(self.class_names)

    @property
    def image_shape(self) -> tuple[int, int]:
        """(H, W) of every image."""
        return int(self.images.shape[1]), int(self.images.shape[2])

    def subset(self, indices: Sequence[int] | np.ndarray) -> LabeledImages:
        """The items at `indices` (int positions or a boolean mask of length N), same label space."""
        index = np.asarray(indices)
        if index.dtype == bool:
            if index.shape != (len(self),):
                raise ValueError(f"indices: boolean mask must have shape ({len(self)},), got {index.shape}")
            index = np.flatnonzero(index)
        elif index.size == 0:
            index = index.astype(np.int64)
        if index.ndim != 1 or not np.issubdtype(index.dtype, np.integer):
            raise ValueError(f"indices: expected a 1-D integer array or boolean mask, got {_describe(index)}")
        if index.size and (index.min() < 0 or index.max() >= len(self)):
            raise ValueError(f"indices: values must lie in [0, {len(self)}), got range [{index.min()}, {index.max()}]")
        return LabeledImages(
            images=self.images[index],
            labels=self.labels[index],
            ids=self.ids[index],
            class_names=list(self.class_names),
        )


def channel_statistics(data: LabeledImages) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """Per-channel mean and standard deviation of the pixels scaled to [0, 1] (for `ImageTensorDataset`)."""
    if len(data) == 0:
        raise ValueError("data: cannot compute channel statistics of an empty image set")
    pixels = data.images.reshape(-1, 3).astype(np.float64) / 255.0
    mean, std = pixels.mean(axis=0), pixels.std(axis=0)
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)  # type: ignore[return-value]


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


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"ndarray(dtype={value.dtype}, shape={value.shape})"
    return type(value).__name__
