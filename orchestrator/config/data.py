"""The ``data`` section: the training data, its splits and the update scenario."""
from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator import limits
from orchestrator.config.problems import StrictModel, problem, raise_problems
from orchestrator.config.sources import check_options, check_split, missing_options, source_name
from orchestrator.data.registry import loader_kwargs
from orchestrator.data.scenarios import class_increment_splits

ScenarioName = Literal["extended_class", "extended_data", "new_architecture", "both", "multi_step", "custom"]
SCENARIOS: tuple[str, ...] = typing.get_args(ScenarioName)


class TaskSplits(StrictModel):
    """A class-incremental sequence: classes [0, first) in task 1, then ``step`` more per task.

    first: the classes of task 1.
    step:  the classes each later task adds (the class count minus ``first`` must be a multiple).

    (first 10, step 15) on 100 classes is the 7-task [10, 15×6] sequence and (10, 3) the 31-task
    one (stationary_dsimplex.md §6.2); (20, 20) HBCT's 5 stages (hbct.md §14). Classes are taken in
    label order, unshuffled (stationary_dsimplex.md §7.1).
    """

    first: int = Field(ge=1, le=limits.MAX_CLASSES)
    step: int = Field(ge=1, le=limits.MAX_CLASSES)

    def splits(self, num_classes: int) -> list[list[int]]:
        """The class list of each task (``class_increment_splits``)."""
        return class_increment_splits(num_classes, self.first, self.step)


class DataSettings(StrictModel):
    """The training data, its splits and the update scenario.

    source:          a data source name (``orchestrator.data.SOURCE_NAMES``).
    options:         keyword arguments of that source's loader (``root_or_url`` for CIFAR, ``root``
                     for folders, ``path_or_url`` for Parquet, ...); unknown ones are errors.
    split_options:   per-split options merged over ``options`` (for sources without a ``split``
                     argument, e.g. two image folders: ``{train: {root: a}, test: {root: b}}``).
    image_size:      passed to loaders that take ``image_size`` (digits, folders, Parquet, Tiny-
                     ImageNet); None keeps the native size. CIFAR images are 32×32.
    train_split:     the split generations train on.
    eval_split:      the split compatibility is measured on (query = gallery, leave-one-out).
    train_per_class: keep only the first N training items of each class in dataset order
                     (CIFAR100R = 300, stationary_dsimplex.md §7.1); None keeps all.
    scenario:        the kind of update the file describes (hbct.md §10, stationary_dsimplex.md §6),
                     recorded with the run and checked against the generations: extended_class /
                     both need a generation on a class subset, extended_data one on a data fraction,
                     new_architecture / both two architectures, multi_step ``task_splits`` and task
                     selections; custom checks nothing.
    task_splits:     the class-incremental sequence that ``classes: {task: i}`` refers to.
    """

    source: str
    options: dict[str, Any] = Field(default_factory=dict)
    split_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    image_size: int | None = Field(32, ge=1, le=limits.MAX_IMAGE_SIZE)
    train_split: str = "train"
    eval_split: str = "test"
    train_per_class: int | None = Field(None, ge=1, le=limits.MAX_ITEMS)
    scenario: ScenarioName = "custom"
    task_splits: TaskSplits | None = None

    @field_validator("source")
    @classmethod
    def _check_source(cls, source: str) -> str:
        return source_name(source)

    @field_validator("options", "split_options", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @model_validator(mode="after")
    def _check_loader(self) -> DataSettings:
        problems = check_options(self.source, self.options, ("options",))
        for split, options in self.split_options.items():
            problems += check_options(self.source, options, ("split_options", split))
        for field in ("train_split", "eval_split"):
            problems += check_split(self.source, getattr(self, field), self.split_options, (field,))
        for split in sorted({self.train_split, self.eval_split}):
            merged = {**self.options, **self.split_options.get(split, {})}
            missing = missing_options(self.source, merged)
            if missing:
                problems.append(problem(("options",), f"source {self.source!r} needs the option(s) "
                                        f"{', '.join(missing)} (for split {split!r})"))
                break
        raise_problems(problems)
        return self

    def loader_kwargs(self, split: str) -> dict[str, Any]:
        """Keyword arguments of ``load_source(self.source, **kwargs)`` for ``split``."""
        return loader_kwargs(self.source, self.options, split, self.image_size, self.split_options)
