"""Which training items each model generation sees: pure index selection on a label array.

HBCT (hbct.md §10) defines four old->new update scenarios; HBCT §14 and d-Simplex
(stationary_dsimplex.md §6.2, §7.1) define multi-step class-incremental sequences. Every function
here takes `labels` int (N,) and returns sorted int64 positions into it (or class lists), so the same
selection applies to any `LabeledImages` through `subset`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

import numpy as np


class Scenario(str, Enum):
    """HBCT's update scenarios (hbct.md §10 table)."""

    EXTENDED_CLASS = "extended_class"
    EXTENDED_DATA = "extended_data"
    NEW_ARCHITECTURE = "new_architecture"
    BOTH = "both"

    @property
    def changes_architecture(self) -> bool:
        """True where the new model swaps ResNet18 for ViT-B-16 (new architecture, both)."""
        return self in (Scenario.NEW_ARCHITECTURE, Scenario.BOTH)


def first_classes(labels: np.ndarray, fraction: float) -> np.ndarray:
    """The first ceil(fraction * C) of the C classes present in `labels`, by ascending class index.

    Decision: "the first 50% of classes" (hbct.md §10, ambiguity §15.16) is read as the lowest class
    indices (0..49 for CIFAR-100; for Tiny-ImageNet the first 100 wnids in sorted order, the order
    `load_tiny_imagenet` assigns), because that is the dataset's own order and needs no seed.
    """
    classes = np.unique(_check_labels(labels))
    _check_fraction("fraction", fraction)
    count = math.ceil(round(fraction * classes.size, 9))  # round: 0.3 * 10 must give 3, not 4
    return classes[:count]


def extended_class(labels: np.ndarray, old_class_fraction: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Extended-class scenario (hbct.md §10): old = items of the first ceil(f*C) classes, new = all items."""
    _check_fraction("old_class_fraction", old_class_fraction)
    old = select_classes(labels, first_classes(labels, old_class_fraction))
    return old, np.arange(len(labels), dtype=np.int64)


def extended_data(
    labels: np.ndarray, old_data_fraction: float = 0.3, seed: int = 0, stratified: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Extended-data scenario (hbct.md §10): old = a random `old_data_fraction` of the items, new = all.

    Decision: stratified by class by default (ambiguity §15.16), so the old model sees every class in
    the same proportion as the full set; `stratified=False` draws uniformly over items.
    """
    labels = _check_labels(labels)
    _check_fraction("old_data_fraction", old_data_fraction)
    if stratified:
        old = stratified_sample(labels, old_data_fraction, seed)
    else:
        count = _rounded_count(old_data_fraction, labels.size)
        rng = np.random.default_rng(seed)
        old = np.sort(rng.choice(labels.size, size=count, replace=False)).astype(np.int64)
    if old.size == 0:
        raise ValueError(f"old_data_fraction: {old_data_fraction} of {labels.size} items selects no item")
    return old, np.arange(labels.size, dtype=np.int64)


def scenario_indices(
    scenario: Scenario | str,
    labels: np.ndarray,
    *,
    old_class_fraction: float = 0.5,
    old_data_fraction: float = 0.3,
    seed: int = 0,
    stratified: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """(old_indices, new_indices) of the training items for each HBCT scenario (hbct.md §10 table).

    extended_class: old = first 50% of classes, new = all. extended_data: old = random 30%, new = all.
    new_architecture: old = new = all. both: old = first 50% of classes, new = all (the architecture
    change is the caller's; see `Scenario.changes_architecture`).
    """
    try:
        kind = Scenario(scenario)
    except ValueError:
        known = ", ".join(s.value for s in Scenario)
        raise ValueError(f"scenario: unknown scenario {scenario!r}; known: {known}") from None
    if kind in (Scenario.EXTENDED_CLASS, Scenario.BOTH):
        return extended_class(labels, old_class_fraction)
    if kind is Scenario.EXTENDED_DATA:
        return extended_data(labels, old_data_fraction, seed=seed, stratified=stratified)
    everything = np.arange(len(_check_labels(labels)), dtype=np.int64)
    return everything, everything.copy()


def stratified_sample(labels: np.ndarray, fraction: float, seed: int = 0) -> np.ndarray:
    """Sorted positions of a class-stratified random `fraction` of the items.

    The total is round(fraction * N); per-class counts are floor(fraction * n_c) plus one for the
    classes with the largest remainders (ties to the lower class index) until the total is reached,
    so each class gets fraction * n_c within one item. Deterministic in `seed`.
    """
    labels = _check_labels(labels)
    _check_fraction("fraction", fraction)
    classes, counts = np.unique(labels, return_counts=True)
    quotas = np.floor(fraction * counts + 1e-9).astype(np.int64)
    remainders = fraction * counts - quotas
    missing = _rounded_count(fraction, labels.size) - int(quotas.sum())
    if missing > 0:
        order = np.lexsort((classes, -remainders))  # largest remainder first, then lower class
        quotas[order[:missing]] += 1
    rng = np.random.default_rng(seed)
    chosen = [
        rng.choice(np.flatnonzero(labels == c), size=int(q), replace=False) for c, q in zip(classes, quotas)
    ]
    return np.sort(np.concatenate(chosen)).astype(np.int64)


def first_per_class(labels: np.ndarray, per_class: int) -> np.ndarray:
    """Sorted positions of the first `per_class` items of every class in dataset order.

    CIFAR100R keeps the first 300 training images of each class (stationary_dsimplex.md §7.1,
    code `cl_idx[:300]`); classes with fewer items keep them all.
    """
    labels = _check_labels(labels)
    if not isinstance(per_class, (int, np.integer)) or per_class < 1:
        raise ValueError(f"per_class: expected a positive int, got {per_class!r}")
    chosen = [np.flatnonzero(labels == c)[:per_class] for c in np.unique(labels)]
    return np.sort(np.concatenate(chosen)).astype(np.int64) if chosen else np.zeros(0, dtype=np.int64)


def class_increment_splits(num_classes: int, first: int, step: int) -> list[list[int]]:
    """Class lists of a class-incremental sequence: classes [0, first), then `step` more per task.

    (100, 10, 15) -> [10, 15 x 6], 7 tasks; (100, 10, 3) -> [10, 3 x 30], 31 tasks
    (stationary_dsimplex.md §6.2); (100, 20, 20) -> HBCT's 5 stages of 20 (hbct.md §14).
    Classes are taken in label order, unshuffled (stationary_dsimplex.md §7.1, continuum default).
    """
    for name, value in (("num_classes", num_classes), ("first", first), ("step", step)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    if first > num_classes or (num_classes - first) % step:
        raise ValueError(
            f"class_increment_splits: first={first} plus tasks of step={step} cannot cover "
            f"num_classes={num_classes} exactly (num_classes - first = {num_classes - first} "
            f"is not a non-negative multiple of {step})"
        )
    bounds = [0, *range(first, num_classes + 1, step)]
    return [list(range(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]


def cumulative_classes(splits: Sequence[Sequence[int]], task: int) -> list[int]:
    """Sorted classes seen up to and including task `task` (0-indexed) of a sequence of splits."""
    if not 0 <= task < len(splits):
        raise ValueError(f"task: expected 0 <= task < {len(splits)} (number of splits), got {task}")
    return sorted({c for split in splits[: task + 1] for c in split})


def select_classes(labels: np.ndarray, classes: Sequence[int] | np.ndarray) -> np.ndarray:
    """Sorted positions of the items whose label is in `classes`."""
    return np.flatnonzero(np.isin(_check_labels(labels), np.asarray(classes))).astype(np.int64)


def _check_labels(labels: np.ndarray) -> np.ndarray:
    array = np.asarray(labels)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"labels: expected a 1-D integer array, got dtype={array.dtype}, shape={array.shape}")
    return array


def _check_fraction(name: str, fraction: float) -> None:
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"{name}: expected a fraction in (0, 1], got {fraction!r}")


def _rounded_count(fraction: float, total: int) -> int:
    """round(fraction * total), halves up, robust to float noise (0.3 * 10 = 3.0000000000000004)."""
    return int(math.floor(round(fraction * total, 9) + 0.5))
