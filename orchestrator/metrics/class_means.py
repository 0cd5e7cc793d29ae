"""Distance of each item to its class mean (λ-orthogonality §2.11, the backfill priority), one
implementation for a whole gallery and for one computed shard by shard.

μ_c is the mean of the features F(h_i) of class c over the WHOLE gallery; d_i = ‖F(h_i) − μ_{y_i}‖₂
(``l2``, the paper's default "MSE") or 1 − cos(F(h_i), μ_{y_i}) (``cosine``, App. G). Over a sharded
gallery the means come from per-shard class sums (``class_sums``, float64) added up
(``combine_class_sums``), and each shard's distances from those (``distances_to_class_means``), so no
process ever holds the whole gallery; ``class_mean_distances`` is the same computed in one piece.
NumPy only: the Ray scoring tasks import it without torch.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import numpy as np

Distance = Literal["l2", "cosine"]


def class_sums(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n, D) features and (n,) labels → (classes (c,), sums (c, D) float64, counts (c,))."""
    classes, index = np.unique(np.asarray(labels, dtype=np.int64), return_inverse=True)
    sums = np.zeros((classes.size, features.shape[1]), dtype=np.float64)
    np.add.at(sums, index, np.asarray(features, dtype=np.float64))
    return classes, sums, np.bincount(index, minlength=classes.size)


def combine_class_sums(parts: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict[int, np.ndarray]:
    """Per-shard ``class_sums`` → the gallery-wide class means {class: (D,) float64}; ValueError when
    the shards' features have different widths (no common space)."""
    parts = list(parts)
    widths = {part_sums.shape[1] for _classes, part_sums, _counts in parts if len(part_sums)}
    if len(widths) > 1:
        raise ValueError(f"the candidate shards' embeddings have different widths {sorted(widths)}; class means "
                         "need one space (use order 'random' or 'uncertainty')")
    sums: dict[int, np.ndarray] = {}
    counts: dict[int, int] = {}
    for classes, part_sums, part_counts in parts:
        for c, s, n in zip(classes.tolist(), part_sums, part_counts.tolist()):
            sums[c] = sums[c] + s if c in sums else s.copy()
            counts[c] = counts.get(c, 0) + n
    return {c: sums[c] / counts[c] for c in sums}


def distances_to_class_means(features: np.ndarray, labels: np.ndarray, means: Mapping[int, np.ndarray],
                             distance: Distance = "l2") -> np.ndarray:
    """(n, D) features, (n,) labels and {class: (D,) mean} → (n,) float64 d_i (module docstring)."""
    if distance not in ("l2", "cosine"):
        raise ValueError(f"distance must be 'l2' or 'cosine', got {distance!r}")
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size == 0:
        return np.zeros(0, dtype=np.float64)
    present = np.unique(labels)
    item_means = np.stack([means[int(c)] for c in present])[np.searchsorted(present, labels)]
    features = np.asarray(features, dtype=np.float64)
    if distance == "l2":
        return np.linalg.norm(features - item_means, axis=1)
    norms = np.maximum(np.linalg.norm(features, axis=1) * np.linalg.norm(item_means, axis=1), 1e-8)
    return 1.0 - np.einsum("nd,nd->n", features, item_means) / norms


def class_mean_distances(features: np.ndarray, labels: np.ndarray, distance: Distance = "l2") -> np.ndarray:
    """d_i over one whole gallery: (n, D) features, (n,) labels → (n,) float64."""
    return distances_to_class_means(features, labels, combine_class_sums([class_sums(features, labels)]), distance)
