"""The training items of a pipeline generation: its class selection, then its data fraction.

``training_indices`` reads the fields of a generation of a pipeline file (``GenerationSpec`` and
its ``ClassSelection``, ``orchestrator.config``) through the protocols below, so the data layer
does not import the configuration.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from orchestrator.data.scenarios import (
    class_increment_splits,
    cumulative_classes,
    first_classes,
    select_classes,
    stratified_sample,
)


class ClassRule(Protocol):
    """Which classes: exactly one of ``ids``, ``first_fraction`` or ``task`` (``ClassSelection``)."""

    ids: list[int] | None
    first_fraction: float | None
    task: int | None
    memory_per_class: int | None


class TrainingItems(Protocol):
    """The fields of a generation that choose its training items (``GenerationSpec``)."""

    name: str
    classes: ClassRule | None
    data_fraction: float
    data_seed: int


class TaskSequence(Protocol):
    """A class-incremental sequence: ``first`` classes in task 1, ``step`` more per task (``TaskSplits``)."""

    first: int
    step: int


def training_indices(generation: TrainingItems, labels: np.ndarray, task_splits: TaskSequence | None = None) -> np.ndarray:
    """Sorted positions into ``labels`` (int (N,), the training split) of a generation's items.

    Applies ``generation.classes`` (see ``ClassSelection``), then ``data_fraction`` (class-
    stratified, ``data_seed``). ``task_splits`` is ``data.task_splits`` (needed by task selections).
    """
    labels = np.asarray(labels)
    selection = generation.classes
    if selection is None:
        chosen = np.arange(labels.size, dtype=np.int64)
    elif selection.ids is not None:
        chosen = select_classes(labels, selection.ids)
    elif selection.first_fraction is not None:
        chosen = select_classes(labels, first_classes(labels, selection.first_fraction))
    else:
        chosen = _task_items(generation, selection, labels, task_splits)
    if chosen.size == 0:
        raise ValueError(f"generation {generation.name!r}: its class selection matches no training item")
    if generation.data_fraction < 1:
        chosen = chosen[stratified_sample(labels[chosen], generation.data_fraction, generation.data_seed)]
    return chosen


def _task_items(generation: TrainingItems, selection: ClassRule, labels: np.ndarray,
                task_splits: TaskSequence | None) -> np.ndarray:
    """A ``{task: i}`` selection: the classes seen so far, or task i's own with an episodic memory."""
    if task_splits is None:
        raise ValueError(f"generation {generation.name!r}: classes {{task: {selection.task}}} needs data.task_splits")
    splits = class_increment_splits(int(np.unique(labels).size), task_splits.first, task_splits.step)
    seen = cumulative_classes(splits, selection.task - 1)
    if selection.memory_per_class is None:
        return select_classes(labels, seen)
    parts = [select_classes(labels, splits[selection.task - 1])]
    for cls in sorted(set(seen) - set(splits[selection.task - 1])):
        positions = np.flatnonzero(labels == cls)
        rng = np.random.default_rng([generation.data_seed, int(cls)])  # one fixed memory per class
        take = min(selection.memory_per_class, positions.size)
        parts.append(rng.choice(positions, size=take, replace=False))
    return np.sort(np.concatenate(parts)).astype(np.int64)
