"""Class-mean distances computed shard by shard (λ-orthogonality §2.11, backfill order).

``class_mean_distance_priority`` needs the gallery-wide mean μ_c of the forward-adapted
embeddings F(h_i) of each class; over a sharded gallery the means come from per-shard class sums
(``class_sums``, float64) added up, and each shard's distances ‖F(h_i) − μ_{y_i}‖₂ from those
(``distances_to_class_means``), so no process ever holds the whole gallery.
"""
from __future__ import annotations

import numpy as np


def class_sums(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n, D) features and (n,) labels → (classes (c,), sums (c, D) float64, counts (c,))."""
    classes, index = np.unique(np.asarray(labels, dtype=np.int64), return_inverse=True)
    sums = np.zeros((classes.size, features.shape[1]), dtype=np.float64)
    np.add.at(sums, index, np.asarray(features, dtype=np.float64))
    return classes, sums, np.bincount(index, minlength=classes.size)


def distances_to_class_means(features: np.ndarray, labels: np.ndarray, means: dict[int, np.ndarray]) -> np.ndarray:
    """(n, D) features, (n,) labels and {class: (D,) mean} → (n,) float64 ‖f_i − μ_{y_i}‖₂."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size == 0:
        return np.zeros(0, dtype=np.float64)
    table = np.stack([means[int(c)] for c in np.unique(labels)])
    position = np.searchsorted(np.unique(labels), labels)
    return np.linalg.norm(np.asarray(features, dtype=np.float64) - table[position], axis=1)
