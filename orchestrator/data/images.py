"""In-memory labelled image sets (numpy only; their torch side is ``orchestrator.data.tensors``).

`LabeledImages` is what every source in `sources.py` returns and what every scenario in
`scenarios.py` selects from: uint8 HWC pixels, int64 class labels, int64 ids that stay attached to an
item through every subset (retrieval uses them to drop a query's own item from its ranking).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


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


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"ndarray(dtype={value.dtype}, shape={value.shape})"
    return type(value).__name__
