"""Pipeline files: typed models of the YAML that ``orchestrator run`` executes, and their loader.

A pipeline file names where results go (``storage``: a local path or ``s3://``), the lineage store
(``lineage``: a SQLAlchemy URL, SQLite under the storage by default), the Ray cluster (``ray``), the
training data and update scenario (``data``), the served gallery (``gallery``), how generations are
compared (``evaluation``) and the list of model ``generations`` in training order, each with its
parent, encoder, compatibility method and hyperparameters, training settings, training items and
backfill policy. ``pipelines/lifelong.yaml`` is the commented reference.

Every model forbids unknown fields, so a typo is an error rather than a silently ignored default.
``load_pipeline`` reads a file with ``orchestrator.bounded_yaml`` (``yaml.safe_load`` within the
bounds of ``orchestrator.limits``) and turns every problem into one line naming
the file, the field path and the bad value::

    pipelines/x.yaml: generations[1].method.params.lam: Input should be greater than or equal to 0 (got -1) [line 23]

The method parameters are validated by the method's own ``Params`` model (``orchestrator.methods``),
so YAML, Tune and the CLI share one definition and the papers' defaults. Cross-field rules
(unique names, parents defined before their children, the evaluation reference, ...) are checked
here; whether a parent's and a child's embedding spaces can be searched together is checked by the
pipeline when it builds the models.

Decisions:
- Relative local paths (storage, SQLite lineage, data roots) are relative to the working directory,
  not to the YAML file, as ``orchestrator run pipelines/x.yaml`` is run from a project root.
- Multi-step tasks are counted from 1, as the papers do ("replacements at tasks 3 and 5",
  stationary_dsimplex.md §6.2); ``classes: {task: 0}`` is an error.
- ``training.augment`` (per generation) is the only augmentation switch; the data block has none.
- Overrides (CLI ``--storage``, ``--ray-address``) are applied to the raw YAML before validation,
  so an override is validated exactly like the file; a ``None`` override value means "not given".
- ``config_sha256`` hashes the validated, normalised config (defaults filled in, method parameters
  completed by the method's ``Params``), so key order, comments and spelled-out defaults do not
  change it and any effective value does.
"""
from __future__ import annotations

import difflib
import hashlib
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import timm
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from orchestrator import bounded_yaml, limits
from orchestrator.bounded_yaml import YAMLLimitError
from orchestrator.data import sources
from orchestrator.data.gallery_sources import STREAMED_SOURCES
from orchestrator.data.scenarios import (
    class_increment_splits,
    cumulative_classes,
    first_classes,
    select_classes,
    stratified_sample,
)
from orchestrator.methods.registry import available_methods, create_method, method_class
from orchestrator.metrics import METRICS
from orchestrator.models.encoder import HUB, EncoderConfig
from orchestrator.names import Name
from orchestrator.training.config import TrainConfig

STORAGE_SCHEMES = ("file", "s3", "memory")
LINEAGE_SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")
# MLflow tracking URIs: its SQL stores (with a driver: postgresql+psycopg2://), a tracking server, Databricks
TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
ScenarioName = Literal["extended_class", "extended_data", "new_architecture", "both", "multi_step", "custom"]
SCENARIOS: tuple[str, ...] = typing.get_args(ScenarioName)

_NO_INPUT = object()  # a problem that shows no "(got ...)" value


class PipelineConfigError(ValueError):
    """A pipeline file that cannot be used; ``str(error)`` is one line per problem.

    file:     the path as given to ``load_pipeline``.
    problems: the lines without the file prefix (``"<field path>: <message>"``).
    """

    def __init__(self, file: str, problems: list[str]):
        self.file = file
        self.problems = problems
        super().__init__("\n".join(f"{file}: {problem}" for problem in problems))


# --------------------------------------------------------------------------- problems


def _problem(loc: tuple, msg: str, value: Any = _NO_INPUT) -> dict[str, Any]:
    """One problem below the location of the validator that reports it (``loc`` is relative)."""
    problem = {"loc": tuple(loc), "msg": msg, "type": "config_problem"}
    if value is not _NO_INPUT:
        problem["input"] = value
    return problem


def _raise_problems(problems: list[dict[str, Any]]) -> None:
    """Raise the problems as one pydantic error whose context carries them with their own locations.

    pydantic gives a validator's error the validator's location only; ``load_pipeline`` expands the
    ``problems`` in the context so that each names its own field. For direct ``model_validate``
    calls the summary lists them too.
    """
    if problems:
        summary = "; ".join(f"{_path(p['loc']) or '(here)'}: {_with_value(p['msg'], p)}" for p in problems)
        raise PydanticCustomError("config_problems", "{summary}", {"summary": summary, "problems": problems})


def _problems_from(error: ValidationError, model: type[BaseModel]) -> list[dict[str, Any]]:
    """A nested model's validation errors as problems (with the allowed names for unknown fields)."""
    problems = []
    for err in error.errors(include_url=False):
        problem = {key: err[key] for key in ("loc", "msg", "type", "input") if key in err}
        if err["type"] == "extra_forbidden":
            problem["allowed"] = _fields_at(model, err["loc"][:-1])
        problems.append(problem)
    return problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- ray


class RaySettings(_Strict):
    """Where and how widely each generation trains.

    address:         None (or "local") starts a local Ray; "auto" joins the cluster of this node
                     (``ray start --head``, ``ray job submit``); "host:6379"; "ray://host:10001".
    num_workers:     data-parallel training workers (Ray Train ``ScalingConfig.num_workers``).
    cpus_per_worker: CPUs reserved per worker.
    gpus_per_worker: GPUs per worker; with ``use_gpu`` and 0 here, one GPU per worker (Ray's default).
    use_gpu:         train on GPUs.
    max_failures:    worker-failure retries of a training run (-1: unlimited; Ray ``FailureConfig``).
    checkpoints_to_keep: the newest epoch checkpoints Ray Train keeps per generation (older ones are
                     deleted; a restarted worker resumes from the newest). The finished generation
                     is saved separately and never deleted.
    dashboard:       a local Ray (address null) starts its dashboard, and the run prints its address
                     (a cluster's dashboard is the cluster's; its address is printed when Ray gives it).
    """

    address: str | None = None
    num_workers: int = Field(1, ge=1, le=limits.MAX_WORKERS)
    cpus_per_worker: float = Field(1.0, gt=0, le=limits.MAX_CPUS)
    gpus_per_worker: float = Field(0.0, ge=0, le=limits.MAX_GPUS)
    use_gpu: bool = False
    max_failures: int = Field(2, ge=-1, le=limits.MAX_FAILURES)
    checkpoints_to_keep: int = Field(2, ge=1, le=limits.MAX_CHECKPOINTS_TO_KEEP)
    dashboard: bool = False

    @field_validator("address")
    @classmethod
    def _check_address(cls, address: str | None) -> str | None:
        if address is None or address.strip() in ("", "local"):
            return None
        address = address.strip()
        if address == "auto" or re.fullmatch(r"ray://[^\s/]+", address) or re.fullmatch(r"[\w.-]+:\d+", address):
            return address
        if address.startswith(("http://", "https://")):
            raise ValueError(
                "that is the dashboard / job-submission address (give it to `ray job submit`); "
                "here use 'auto', 'host:6379' or 'ray://host:10001'"
            )
        raise ValueError("expected null or 'local' (a local Ray), 'auto', 'host:port' or 'ray://host:port'")

    @model_validator(mode="after")
    def _check_gpus(self) -> RaySettings:
        if self.gpus_per_worker > 0 and not self.use_gpu:
            _raise_problems([_problem(("gpus_per_worker",), "GPUs per worker need use_gpu: true", self.gpus_per_worker)])
        return self


# --------------------------------------------------------------------------- data


# the keyword arguments each source's loader takes; the pipeline sets the reserved ones itself
_LOADERS: dict[str, Callable[..., Any]] = {
    **sources.SOURCE_SIGNATURES,
    **STREAMED_SOURCES,  # gallery-only sources, read in pieces (orchestrator.data.gallery_sources)
}
_RESERVED_OPTIONS = {"split": "train_split / eval_split / gallery.split", "image_size": "data.image_size", "variant": "source"}
# split names of the loaders that take a `split` argument (see orchestrator.data.sources)
_SPLITS: dict[str, tuple[str, ...]] = sources.SOURCE_SPLITS


def _loader_parameters(source: str) -> dict[str, inspect.Parameter] | None:
    loader = _LOADERS.get(source)
    return None if loader is None else dict(inspect.signature(loader).parameters)


def _check_options(source: str, options: Mapping[str, Any], where: tuple) -> list[dict[str, Any]]:
    """Problems with a source's loader options: unknown keys, reserved keys, missing required ones."""
    parameters = _loader_parameters(source)
    if parameters is None:  # a source this module has no signature for: the loader checks its options
        return []
    accepted = [name for name in parameters if name not in _RESERVED_OPTIONS]
    problems = []
    for key, value in options.items():
        if key in _RESERVED_OPTIONS:
            problems.append(_problem((*where, key), f"set by {_RESERVED_OPTIONS[key]}, not as a loader option", value))
        elif key not in parameters:
            problems.append(
                _problem((*where, key), f"unknown option of source {source!r}{_suggest(key, accepted)}; accepted: "
                         f"{', '.join(accepted)}", value)
            )
    return problems


def _missing_options(source: str, options: Mapping[str, Any]) -> list[str]:
    parameters = _loader_parameters(source) or {}
    return [
        name for name, p in parameters.items()
        if p.default is inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD and name not in _RESERVED_OPTIONS
        and name not in options
    ]


def loader_kwargs(
    source: str, options: Mapping[str, Any], split: str, image_size: int | None, split_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Keyword arguments of ``load_source(source, **kwargs)`` for one split.

    ``options`` merged with ``split_options[split]``; ``split`` passed when the loader takes one,
    ``image_size`` when it takes one and is not None.
    """
    kwargs = {**options, **dict((split_options or {}).get(split) or {})}
    parameters = _loader_parameters(source) or {}
    if "split" in parameters:
        kwargs["split"] = split
    if "image_size" in parameters and image_size is not None:
        kwargs["image_size"] = image_size
    return kwargs


def _check_split(source: str, split: str, split_options: Mapping[str, Any], where: tuple) -> list[dict[str, Any]]:
    parameters = _loader_parameters(source)
    if parameters is None:
        return []
    if "split" in parameters:
        known = _SPLITS.get(source)
        if known is not None and split not in known:
            return [_problem(where, f"source {source!r} has the splits {', '.join(known)}", split)]
        return []
    if split not in split_options:
        return [_problem(where, f"source {source!r} has no split argument: give this split's loader options "
                                f"(e.g. its root) under data.split_options.{split}", split)]
    return []


def _source_name(source: str, streamed: bool = False) -> str:
    if streamed and source in STREAMED_SOURCES:
        return source
    if source not in sources.SOURCE_NAMES:
        raise ValueError(f"unknown data source{_suggest(source, sources.SOURCE_NAMES)}; known: {', '.join(sources.SOURCE_NAMES)}")
    return source


class TaskSplits(_Strict):
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


class DataSettings(_Strict):
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
        return _source_name(source)

    @field_validator("options", "split_options", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @model_validator(mode="after")
    def _check_loader(self) -> DataSettings:
        problems = _check_options(self.source, self.options, ("options",))
        for split, options in self.split_options.items():
            problems += _check_options(self.source, options, ("split_options", split))
        for field in ("train_split", "eval_split"):
            problems += _check_split(self.source, getattr(self, field), self.split_options, (field,))
        for split in sorted({self.train_split, self.eval_split}):
            merged = {**self.options, **self.split_options.get(split, {})}
            missing = _missing_options(self.source, merged)
            if missing:
                problems.append(_problem(("options",), f"source {self.source!r} needs the option(s) "
                                         f"{', '.join(missing)} (for split {split!r})"))
                break
        _raise_problems(problems)
        return self

    def loader_kwargs(self, split: str) -> dict[str, Any]:
        """Keyword arguments of ``load_source(self.source, **kwargs)`` for ``split``."""
        return loader_kwargs(self.source, self.options, split, self.image_size, self.split_options)


# --------------------------------------------------------------------------- generations


class ClassSelection(_Strict):
    """Which classes (and items) a generation trains on; ``classes: null`` (the default) is all.

    Exactly one of:
    - ``ids``: explicit class ids; in YAML simply ``classes: [0, 1, 2]``.
    - ``first_fraction``: the first ceil(f·C) classes by class index (extended-class, hbct.md §10).
    - ``task``: cumulative classes of tasks 1..task of ``data.task_splits`` (counted from 1). With
      ``memory_per_class`` m, the items of task ``task``'s own classes plus m items of each earlier
      class (an episodic memory, stationary_dsimplex.md §6.3; drawn once per class, seeded, so a
      class keeps the same memory items in every later task); without it, all items of all
      classes seen so far.
    - ``memory_per_class``: with ``task``, the episodic memory size m above.
    """

    ids: list[Annotated[int, Field(ge=0, lt=limits.MAX_CLASSES)]] | None = Field(
        None, min_length=1, max_length=limits.MAX_CLASSES)
    first_fraction: float | None = Field(None, gt=0, le=1)
    task: int | None = Field(None, ge=1, le=limits.MAX_CLASSES)
    memory_per_class: int | None = Field(None, ge=1, le=limits.MAX_ITEMS)

    @model_validator(mode="before")
    @classmethod
    def _list_is_ids(cls, value: Any) -> Any:
        return {"ids": value} if isinstance(value, (list, tuple)) else value

    @model_validator(mode="after")
    def _one_rule(self) -> ClassSelection:
        given = [name for name in ("ids", "first_fraction", "task") if getattr(self, name) is not None]
        problems = []
        if len(given) != 1:
            problems.append(_problem((), "give exactly one of: a list of class ids, {first_fraction: f} or {task: i}"
                                     + (f" (got {', '.join(given)})" if given else "")))
        if self.memory_per_class is not None and self.task is None:
            problems.append(_problem(("memory_per_class",), "applies to {task: i} selections only", self.memory_per_class))
        if self.ids is not None and len(set(self.ids)) != len(self.ids):
            problems.append(_problem(("ids",), "class ids must be unique", self.ids))
        _raise_problems(problems)
        return self


class MethodSpec(_Strict):
    """A compatibility method by registry name with its hyperparameters.

    name:   the method's registry name (``orchestrator methods`` lists them).
    params: the method's hyperparameters (its ``Params``; the section "Method parameters" below).

    ``params`` is validated by the method's own ``Params`` model (papers' defaults for missing
    fields, unknown ones rejected) and stored completed, so the config records every value used.
    """

    name: str
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        known = list(available_methods())
        if name not in known:
            raise ValueError(f"unknown method{_suggest(name, known)}; known methods: {', '.join(known)}")
        return name

    @field_validator("params", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("params")
    @classmethod
    def _validate_params(cls, params: dict[str, Any], info: Any) -> dict[str, Any]:
        name = info.data.get("name")
        if name is None:  # the name itself is invalid, reported on its own
            return params
        model = method_class(name).Params
        try:
            return model.model_validate(params).model_dump(mode="json")
        except ValidationError as err:
            _raise_problems(_problems_from(err, model))
            raise  # unreachable: the error always has at least one problem

    def create(self):
        """The method instance (``orchestrator.methods.create_method``)."""
        return create_method(self.name, self.params)

    @property
    def requires_parent(self) -> bool:
        return method_class(self.name).requires_parent


class BackfillPolicy(_Strict):
    """How much of the gallery is re-embedded by a new generation before/while it serves.

    policy:      none (search older shards through compatibility), full (re-embed every shard) or
                 partial (a ``budget``).
    budget:      the fraction in (0, 1] of the gallery to re-embed (partial only).
    budget_unit: the budget counts items or whole shards.
    order:       which items / shards first: highest uncertainty of the old embedding, largest
                 distance to the class means, or random (seeded). Applies to partial and full
                 (full: the order shards are refreshed in).
    """

    policy: Literal["none", "full", "partial"] = "none"
    budget: float | None = Field(None, gt=0, le=1)
    budget_unit: Literal["items", "shards"] = "items"
    order: Literal["uncertainty", "class_mean_distance", "random"] = "random"

    @model_validator(mode="after")
    def _check_budget(self) -> BackfillPolicy:
        problems = []
        if self.policy == "partial" and self.budget is None:
            problems.append(_problem(("budget",), "policy 'partial' needs a budget: a fraction in (0, 1] of the items or shards"))
        if self.policy != "partial" and self.budget is not None:
            problems.append(_problem(("budget",), f"a budget applies to policy 'partial' only (policy is {self.policy!r})", self.budget))
        # defaults are accepted (a normalised dump spells them out), other values are contradictions
        if self.policy != "partial" and self.budget_unit != "items":
            problems.append(_problem(("budget_unit",), f"applies to policy 'partial' only (policy is {self.policy!r})", self.budget_unit))
        if self.policy == "none" and self.order != "random":
            problems.append(_problem(("order",), "policy 'none' re-embeds nothing, so it has no order", self.order))
        _raise_problems(problems)
        return self


class GateSpec(_Strict):
    """What must hold before a generation serves (checked after its gallery plan, before any shard
    changes; the first served generation has nothing to compare with and passes).

    criterion:        the update passes the empirical criterion M(new→served) > M(served→served)
                      against the generation serving now, on ``search.criterion_metric``.
    max_quality_drop: the served gallery's predicted quality after the planned backfill (mAP on the
                      ``gallery-eval`` sample: shards as the plan leaves them, each searched along
                      its comparison path) may be below the quality the serving generation's report
                      measured by at most this much. Unmeasurable on an unlabelled gallery (the
                      gate then says so and checks the criterion only).
    action:           when a check fails: ``hold`` (do not deploy; the serving generation keeps
                      serving, the run stops with a non-zero exit), ``full_backfill`` (re-plan as a
                      full re-embed, then deploy) or ``force`` (deploy anyway, recorded).
    """

    criterion: bool = True
    max_quality_drop: float = Field(0.0, ge=0, le=1)
    action: Literal["hold", "full_backfill", "force"] = "hold"


class GenerationSpec(_Strict):
    """One model generation: what it trains on, how, and what it must stay compatible with.

    name:             unique, a safe path component (``orchestrator.names``: used in paths and the lineage).
    parent:           the generation this one is aligned to (its gallery shards stay searchable),
                      defined earlier in the list; None for a first generation or a reference.
    model:            the encoder (``EncoderConfig``: timm arch, embed_dim, pretrained local path).
    method:           the compatibility method and its parameters.
    training:         optimiser, schedule, epochs, batch size, augmentation, seed (``TrainConfig``).
    classes:          the training classes (``ClassSelection``); None = all.
    data_fraction:    a class-stratified random fraction of the selected items (extended-data,
                      hbct.md §10: 0.3), drawn with ``data_seed``.
    data_seed:        the seed of the ``data_fraction`` draw.
    init_from_parent: start from the parent's weights (sequential fine-tuning, IAM-CL²R
                      stationary_dsimplex.md §6.3) instead of ``model.pretrained`` / random init;
                      needs the parent's architecture and embedding size.
    replaces:         an asynchronous model replacement (stationary_dsimplex.md §6.1): the encoder
                      starts from a third-party pretrained checkpoint (``model.pretrained``, a local
                      path) and is fine-tuned to stay compatible with its parent's gallery.
                      Decision (§6.3 [C]): the frozen model of the alignment term is the checkpoint
                      this generation starts from, as in the released code.
    backfill:         the backfill policy applied when this generation is deployed.
    gate:             what must hold before it serves, and what happens otherwise (``GateSpec``).
    """

    name: Name
    parent: str | None = None
    model: EncoderConfig = Field(default_factory=EncoderConfig)
    method: MethodSpec
    training: TrainConfig = Field(default_factory=TrainConfig)
    classes: ClassSelection | None = None
    data_fraction: float = Field(1.0, gt=0, le=1)
    data_seed: int = 0
    init_from_parent: bool = False
    replaces: bool = False
    backfill: BackfillPolicy = Field(default_factory=BackfillPolicy)
    gate: GateSpec = Field(default_factory=GateSpec)

    @model_validator(mode="after")
    def _check_generation(self) -> GenerationSpec:
        problems = []
        if not timm.is_model(self.model.arch):
            problems.append(_problem(("model", "arch"), f"not a timm model name{_suggest(self.model.arch, timm.list_models())}",
                                     self.model.arch))
        if self.replaces:
            if self.model.pretrained in (None, HUB):
                problems.append(_problem(("model", "pretrained"), "a replacement (replaces: true) starts from a third-party "
                                         "checkpoint: give its local path", self.model.pretrained))
            if self.init_from_parent:
                problems.append(_problem(("init_from_parent",), "a replacement starts from model.pretrained, not from its parent", True))
        if self.init_from_parent and self.model.pretrained is not None:
            problems.append(_problem(("model", "pretrained"), "unused with init_from_parent: true (the parent's weights are loaded)",
                                     self.model.pretrained))
        _raise_problems(problems)
        return self


class EmbeddingSpec(_Strict):
    """How the gallery is (re-)embedded on Ray Data: ``map_batches`` over an actor pool.

    batch_size:  images per model call.
    concurrency: actors in the pool (each loads the generation once).
    num_cpus / num_gpus: resources per actor (a GPU actor runs the model on its GPU).
    """

    batch_size: int = Field(256, ge=1, le=limits.MAX_BATCH_SIZE)
    concurrency: int = Field(1, ge=1, le=limits.MAX_WORKERS)
    num_cpus: float = Field(1.0, gt=0, le=limits.MAX_CPUS)
    num_gpus: float = Field(0.0, ge=0, le=limits.MAX_GPUS)


class GallerySpec(_Strict):
    """The served gallery: which items, how many shards, which index per shard.

    name:             the gallery's name in the lineage, paths and reports (a safe path component).
    source / options: the gallery's own data source (e.g. CIFAR-10 for the open-set evaluation of
                      stationary_dsimplex.md §7.1); None uses ``data.source`` and ``data.options``.
                      Streamed sources, for galleries of any size (never loaded whole):
                      ``parquet_dataset`` (a Parquet file or a directory/prefix of many, local or
                      s3://: options path, image_column, id_column, uri_column, label_column,
                      metadata_columns, image_shape, storage_options) and ``image_files`` (image
                      files under a directory/prefix: options path, labels: folder).
    split:            the split of that source that forms the gallery (in-memory sources only).
    num_shards:       shards are the unit of backfill, lineage and indexing (initial count: an
                      item-level partial backfill moves its items into new shards); default 4.
    items_per_shard:  instead of num_shards: as many shards as this many items per shard need.
    index:            the index kind built per shard (``orchestrator.index.ALL_KINDS``): float
                      ``flat`` / ``ivf`` / ``hnsw``, bit-plane ``binary`` / ``binary_weighted`` /
                      ``binary_two_stage`` / ``binary_ivf``, or ``pq`` / ``opq`` / ``binary_opq``.
    index_options:    that kind's build options (``orchestrator.index.OPTIONS[index]``, e.g.
                      ``{bits: 2}``); names are checked here, values when the index is built.
    embedding:        batch size, actor-pool size and resources of the Ray Data embedding.
    """

    name: Name = "gallery"
    source: str | None = None
    options: dict[str, Any] | None = None
    split: str = "test"
    num_shards: int | None = Field(None, ge=1, le=limits.MAX_SHARDS)
    items_per_shard: int | None = Field(None, ge=1, le=limits.MAX_ITEMS)
    index: str = "flat"
    index_options: dict[str, Any] = Field(default_factory=dict)
    embedding: EmbeddingSpec = Field(default_factory=EmbeddingSpec)

    @model_validator(mode="after")
    def _check_index(self) -> GallerySpec:
        from orchestrator.index import ALL_KINDS, OPTIONS

        if self.index not in ALL_KINDS:
            _raise_problems([_problem(("index",), f"must be one of {', '.join(ALL_KINDS)}", self.index)])
        unknown = sorted(set(self.index_options) - set(OPTIONS[self.index]))
        _raise_problems([_problem(("index_options", name), f"is not an option of index {self.index!r} "
                                  f"(its options: {', '.join(OPTIONS[self.index]) or 'none'})", self.index_options[name])
                         for name in unknown])
        _raise_problems([_problem(("index_options", name), f"at most {limits.MAX_INDEX_OPTIONS[name]} "
                                  "(limits.MAX_INDEX_OPTIONS)", value)
                         for name, value in self.index_options.items() if name in limits.MAX_INDEX_OPTIONS
                         and isinstance(value, (int, float)) and value > limits.MAX_INDEX_OPTIONS[name]])
        return self

    @field_validator("source")
    @classmethod
    def _check_source(cls, source: str | None) -> str | None:
        return None if source is None else _source_name(source, streamed=True)

    @model_validator(mode="after")
    def _one_shard_rule(self) -> GallerySpec:
        if self.num_shards is not None and self.items_per_shard is not None:
            _raise_problems([_problem(("items_per_shard",), "give num_shards or items_per_shard, not both",
                                      self.items_per_shard)])
        return self

    def shard_count(self, num_items: int) -> int:
        """The number of initial shards for a gallery of ``num_items`` items; ValueError naming
        ``gallery.items_per_shard`` when that would make more than ``limits.MAX_SHARDS``."""
        if self.items_per_shard is None:
            return 4 if self.num_shards is None else self.num_shards
        count = max(1, -(-num_items // self.items_per_shard))
        if count > limits.MAX_SHARDS:
            raise ValueError(f"gallery.items_per_shard: {self.items_per_shard} items per shard make {count} shards "
                             f"of the {num_items} gallery items, more than {limits.MAX_SHARDS} (limits.MAX_SHARDS)")
        return count


class EvaluationSpec(_Strict):
    """How generations are compared (hbct.md §11).

    reference: the unaligned model φ_* (a generation with no parent, never deployed) that P_com and
               P_up normalise by; None reports self / cross retrieval and the compatibility matrix
               only. The metrics are fixed: ``METRICS`` = CMC@1, CMC@5, mAP.
    backfill_curves: after each update, also trace the backfilling curve (retrieval quality of
               the served gallery versus the fraction re-embedded in the policy's order,
               λ-orthogonality §2.11) as CSV + PNG; costs one embedding of the whole gallery by
               the new generation, so it is for evaluation runs, not production galleries.
    gallery_sample: the served-gallery report (``gallery-eval``) scores a seeded uniform sample of
               at most this many labelled gallery items (the whole gallery when smaller): each
               stored shard is read and cut to the sample, and the sample is embedded once by the
               serving generation. The router's search row and the backfilling curve need the
               whole gallery. A gallery without labels is not scored (the step says so).
    eval_sample: the compatibility matrices (``evaluate:<gen>``) are measured on a seeded
               class-stratified sample of at most this many items of the evaluation split (the
               whole split when smaller, or when null); each generation embeds it once and its
               embeddings are stored and reused by every later generation's evaluation.
    """

    reference: str | None = None
    backfill_curves: bool = False
    gallery_sample: int = Field(10_000, ge=10, le=limits.MAX_ITEMS)
    eval_sample: int | None = Field(10_000, ge=10, le=limits.MAX_ITEMS)

    metrics: ClassVar[tuple[str, ...]] = METRICS


class SearchSpec(_Strict):
    """How the served gallery is searched (``orchestrator.search``) and how that search is scored.

    criterion_metric: the recorded metric of the compatibility criterion M(new→old) > M(old→old)
                      that admits an older generation's shards for the serving generation's queries.
    eval_k:           depth of the pipeline's search evaluation (the router's real top-k through
                      the shard indexes); None: the whole gallery, so its mAP is the full-ranking
                      mAP and equals the exact mixed-gallery number for flat indexes.
    """

    criterion_metric: Literal[METRICS] = "map"  # type: ignore[valid-type]
    eval_k: int | None = Field(None, ge=5, le=limits.MAX_TOP_K)


class TrackingSettings(_Strict):
    """Experiment tracking with MLflow (optional: the ``tracking`` extra, ``pip install -e '.[tracking]'``).

    enabled:    log the run to MLflow: a run per ``orchestrator run`` (the compatibility matrices,
                the report files) and, nested in it, a run per generation (parameters, per-epoch
                losses, checkpoint URI and sha256, compatibility, its update's summary).
    uri:        the MLflow tracking URI (``sqlite:///path/mlflow.db``, ``postgresql://...``,
                ``http(s)://`` server, ``databricks``); default ``sqlite:///<storage>/mlflow.db`` under
                a local storage (required with remote storage when enabled).
    experiment: the MLflow experiment; default the pipeline's name.
    """

    enabled: bool = False
    uri: str | None = None
    # not a Name: an experiment may be a path (Databricks: /Users/<user>/<name>) of a few names
    experiment: str | None = Field(None, min_length=1, max_length=limits.NAME_MAX_LENGTH * 4)

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, uri: str | None) -> str | None:
        if uri is None:
            return None
        uri = uri.strip()
        scheme = _scheme(uri) or ("databricks" if uri == "databricks" else None)
        if scheme is None or scheme.split("+")[0] not in TRACKING_SCHEMES:
            raise ValueError("expected an MLflow tracking URI: sqlite:///path/mlflow.db, postgresql://..., "
                             "http(s)://host:port or databricks")
        return uri


class PipelineConfig(_Strict):
    """A whole pipeline file (see the module docstring and ``pipelines/lifelong.yaml``).

    name:        the pipeline's name, a safe path component (``orchestrator.names``; the default
                 storage is ``./runs/<name>``).
    description: free text, shown nowhere else.
    storage: a local path or ``s3://bucket/prefix`` (also ``file://``; ``memory://`` for tests);
             default ``./runs/<name>``.
    lineage: a SQLAlchemy URL, ``sqlite:///path`` or ``postgresql+psycopg://...``; default a SQLite file
             ``lineage.db`` under a local storage (required with remote storage).
    tracking: optional MLflow experiment tracking (``TrackingSettings``; off by default).
    """

    name: Name
    description: str = ""
    storage: str | None = None
    lineage: str | None = None
    ray: RaySettings = Field(default_factory=RaySettings)
    data: DataSettings
    gallery: GallerySpec = Field(default_factory=GallerySpec)
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    search: SearchSpec = Field(default_factory=SearchSpec)
    generations: list[GenerationSpec] = Field(min_length=1, max_length=limits.MAX_GENERATIONS)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)

    @field_validator("storage")
    @classmethod
    def _check_storage(cls, storage: str | None) -> str | None:
        if storage is None:
            return None
        storage = storage.strip()
        if not storage:
            raise ValueError("expected a local path or an s3:// URL")
        scheme = _scheme(storage)
        if scheme is not None and scheme not in STORAGE_SCHEMES:
            raise ValueError(f"unsupported storage scheme {scheme + '://'!r}; use a local path, "
                             f"{', '.join(s + '://' for s in STORAGE_SCHEMES)}")
        if scheme in ("s3", "memory") and not storage.split("://", 1)[1].strip("/"):
            raise ValueError(f"{scheme}:// needs a bucket / path")
        return storage.rstrip("/") or "/"

    @field_validator("lineage")
    @classmethod
    def _check_lineage(cls, lineage: str | None) -> str | None:
        if lineage is None:
            return None
        scheme = _scheme(lineage.strip())
        if scheme not in LINEAGE_SCHEMES:
            raise ValueError("expected a database URL: sqlite:///path/lineage.db or postgresql+psycopg://user@host/db")
        return lineage.strip()

    @model_validator(mode="after")
    def _defaults_and_cross_checks(self) -> PipelineConfig:
        if self.storage is None:
            self.storage = f"./runs/{self.name}"
        problems = []
        if self.lineage is None:
            if self.is_remote_storage:
                problems.append(_problem(("lineage",), f"required with remote storage ({self.storage}): SQLite cannot "
                                         "live on object storage; give sqlite:///<volume path> or postgresql+psycopg://..."))
            else:
                self.lineage = f"sqlite:///{_local_path(self.storage).rstrip('/')}/lineage.db"
        problems += self._check_generations()
        problems += self._check_reference()
        problems += self._check_gallery()
        problems += self._check_scenario()
        problems += self._tracking_defaults()
        _raise_problems(problems)
        return self

    def _check_generations(self) -> list[dict[str, Any]]:
        problems = []
        position: dict[str, int] = {}
        for i, gen in enumerate(self.generations):
            if gen.name in position:
                problems.append(_problem(("generations", i, "name"), f"duplicate generation name (also generations"
                                         f"[{position[gen.name]}])", gen.name))
            else:
                position[gen.name] = i
        for i, gen in enumerate(self.generations):
            where = ("generations", i)
            if gen.parent is None:
                if gen.method.requires_parent:
                    problems.append(_problem((*where, "parent"), f"method {gen.method.name!r} aligns a model to its "
                                             "parent: name the parent generation", None))
                for flag in ("init_from_parent", "replaces"):
                    if getattr(gen, flag):
                        problems.append(_problem((*where, flag), "needs a parent", True))
            elif gen.parent not in position:
                names = list(position)
                problems.append(_problem((*where, "parent"), f"unknown generation{_suggest(gen.parent, names)}; "
                                         f"generations: {', '.join(names)}", gen.parent))
            elif position[gen.parent] >= i:
                where_parent = "itself" if position[gen.parent] == i else f"generations[{position[gen.parent]}]"
                problems.append(_problem((*where, "parent"), f"a parent must be defined before its child (it is "
                                         f"{where_parent}); list generations in training order", gen.parent))
            elif gen.init_from_parent:
                parent = self.generations[position[gen.parent]].model
                same = ("arch", "embed_dim", "in_chans", "small_input")
                if any(getattr(parent, k) != getattr(gen.model, k) for k in same):
                    problems.append(_problem((*where, "init_from_parent"), f"needs the parent's architecture (parent "
                                             f"{gen.parent!r}: " + ", ".join(f"{k} {getattr(parent, k)!r}" for k in same)
                                             + ")", True))
            if gen.classes is not None and gen.classes.task is not None and self.data.task_splits is None:
                problems.append(_problem((*where, "classes", "task"), "a task selection needs data.task_splits "
                                         "({first: ..., step: ...})", gen.classes.task))
        return problems

    def _check_reference(self) -> list[dict[str, Any]]:
        name = self.evaluation.reference
        if name is None:
            return []
        where = ("evaluation", "reference")
        names = list(dict.fromkeys(g.name for g in self.generations))
        if name not in names:
            return [_problem(where, f"unknown generation{_suggest(name, names)}; generations: {', '.join(names)}", name)]
        index = next(i for i, g in enumerate(self.generations) if g.name == name)
        reference = self.generations[index]
        problems = []
        if reference.parent is not None:
            problems.append(_problem(where, f"the reference φ_* is an unaligned model, but {name!r} has the parent "
                                     f"{reference.parent!r}", name))
        children = [g.name for g in self.generations if g.parent == name]
        if children:
            problems.append(_problem(where, f"the reference is never deployed, so it cannot be a parent (of "
                                     f"{', '.join(children)})", name))
        if reference.backfill.policy != "none":
            problems.append(_problem(("generations", index, "backfill", "policy"),
                                     "the evaluation reference is never deployed: its backfill policy must be 'none'",
                                     reference.backfill.policy))
        return problems

    def _check_gallery(self) -> list[dict[str, Any]]:
        source, options = self.gallery_source
        same_source = self.gallery.source is None
        split_options = self.data.split_options if same_source else {}
        problems = []
        if self.gallery.options is not None:
            problems += _check_options(source, self.gallery.options, ("gallery", "options"))
        if source not in STREAMED_SOURCES:
            problems += _check_split(source, self.gallery.split, split_options, ("gallery", "split"))
        if not same_source or self.gallery.options is not None:
            missing = _missing_options(source, {**options, **split_options.get(self.gallery.split, {})})
            if missing:
                problems.append(_problem(("gallery", "options"), f"source {source!r} needs the option(s) {', '.join(missing)}"))
        used = {self.data.train_split, self.data.eval_split} | ({self.gallery.split} if same_source else set())
        for split in self.data.split_options:
            if split not in used:
                problems.append(_problem(("data", "split_options", split), f"no split of this name is used (used: "
                                         f"{', '.join(sorted(used))})"))
        return problems

    def _check_scenario(self) -> list[dict[str, Any]]:
        scenario, gens = self.data.scenario, self.generations
        needs: list[str] = []
        if scenario in ("extended_class", "both") and not any(g.classes is not None for g in gens):
            needs.append("a generation trained on a class subset (classes: ...)")
        if scenario == "extended_data" and not any(g.data_fraction < 1 for g in gens):
            needs.append("a generation trained on a data fraction (data_fraction < 1)")
        if scenario in ("new_architecture", "both") and len({g.model.arch for g in gens}) < 2:
            needs.append("generations of at least two architectures (model.arch)")
        if scenario == "multi_step" and (
            self.data.task_splits is None or sum(g.classes is not None and g.classes.task is not None for g in gens) < 2
        ):
            needs.append("data.task_splits and at least two generations with classes: {task: i}")
        return [_problem(("data", "scenario"), f"scenario {scenario!r} needs {' and '.join(needs)}", scenario)] if needs else []

    def _tracking_defaults(self) -> list[dict[str, Any]]:
        """The MLflow experiment defaults to the pipeline's name, the URI to a SQLite file under a
        local storage; remote storage needs an explicit URI (SQLite cannot live on object storage)."""
        tracking = self.tracking
        if tracking.experiment is None:
            tracking.experiment = self.name
        if tracking.uri is None and not self.is_remote_storage:
            tracking.uri = f"sqlite:///{_local_path(self.storage).rstrip('/')}/mlflow.db"
        if tracking.uri is None and tracking.enabled:
            return [_problem(("tracking", "uri"), f"required with remote storage ({self.storage}) when tracking is "
                             "enabled: give sqlite:///<volume path>/mlflow.db, postgresql://... or http(s)://<server>")]
        return []

    # --- conveniences for the pipeline ----------------------------------------------------------
    @property
    def is_remote_storage(self) -> bool:
        return _scheme(self.storage or "") not in (None, "file")

    @property
    def gallery_source(self) -> tuple[str, dict[str, Any]]:
        """(source name, loader options) of the gallery (the data's unless the gallery names its own)."""
        if self.gallery.source is None:
            return self.data.source, dict(self.data.options if self.gallery.options is None else self.gallery.options)
        return self.gallery.source, dict(self.gallery.options or {})

    def gallery_loader_kwargs(self) -> tuple[str, dict[str, Any]]:
        """(source, kwargs) so that ``load_source(source, **kwargs)`` loads the gallery items."""
        source, options = self.gallery_source
        split_options = self.data.split_options if self.gallery.source is None else None
        return source, loader_kwargs(source, options, self.gallery.split, self.data.image_size, split_options)

    def generation(self, name: str) -> GenerationSpec:
        for gen in self.generations:
            if gen.name == name:
                return gen
        raise KeyError(f"no generation named {name!r}; generations: {', '.join(g.name for g in self.generations)}")

    def children(self, name: str) -> list[GenerationSpec]:
        return [g for g in self.generations if g.parent == name]

    @property
    def served_generations(self) -> list[GenerationSpec]:
        """The generations that are deployed, in order: all but the evaluation reference."""
        return [g for g in self.generations if g.name != self.evaluation.reference]

    def to_yaml(self) -> str:
        """The normalised config (defaults filled in) as YAML."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


# --------------------------------------------------------------------------- training items


def training_indices(generation: GenerationSpec, labels: np.ndarray, task_splits: TaskSplits | None = None) -> np.ndarray:
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
        if task_splits is None:
            raise ValueError(f"generation {generation.name!r}: classes {{task: {selection.task}}} needs data.task_splits")
        splits = task_splits.splits(int(np.unique(labels).size))
        seen = cumulative_classes(splits, selection.task - 1)
        if selection.memory_per_class is None:
            chosen = select_classes(labels, seen)
        else:
            parts = [select_classes(labels, splits[selection.task - 1])]
            for cls in sorted(set(seen) - set(splits[selection.task - 1])):
                positions = np.flatnonzero(labels == cls)
                rng = np.random.default_rng([generation.data_seed, int(cls)])  # one fixed memory per class
                take = min(selection.memory_per_class, positions.size)
                parts.append(rng.choice(positions, size=take, replace=False))
            chosen = np.sort(np.concatenate(parts)).astype(np.int64)
    if chosen.size == 0:
        raise ValueError(f"generation {generation.name!r}: its class selection matches no training item")
    if generation.data_fraction < 1:
        chosen = chosen[stratified_sample(labels[chosen], generation.data_fraction, generation.data_seed)]
    return chosen


# --------------------------------------------------------------------------- loading


def load_pipeline(path: str | Path, overrides: Mapping[str, Any] | None = None) -> PipelineConfig:
    """Read and validate a pipeline file.

    ``overrides`` maps dotted field paths to values (``{"storage": "s3://b/x", "ray.address":
    "auto", "generations.0.training.epochs": 1}``), applied to the raw YAML before validation;
    None values are skipped. Raises ``PipelineConfigError`` with one line per problem, each naming
    the file, the field path and the bad value (YAML syntax errors: the line and column).
    """
    file, raw, root = read_yaml_mapping(path, "pipeline fields (name, data, generations, ...)")
    raw, overridden = _apply_overrides(file, raw, overrides or {})
    return validate_yaml_mapping(PipelineConfig, file, raw, root, overridden)


def read_yaml_mapping(path: str | Path, expected: str,
                      error: type[PipelineConfigError] = PipelineConfigError) -> tuple[str, dict, yaml.Node]:
    """``(file, data, node tree)`` of a YAML file whose top level must be a mapping (``expected``
    describes its fields for the error). Read within the bounds of ``orchestrator.limits`` by
    ``orchestrator.bounded_yaml`` (``yaml.safe_load``'s types); the node graph gives line numbers.
    Unreadable files, files past a bound, syntax errors and duplicate keys raise ``error``."""
    file = str(path)
    try:
        text = bounded_yaml.read_text(path)
        raw, root = bounded_yaml.load(text)
    except YAMLLimitError as err:
        raise error(file, [_limit_problem(err)]) from None
    except yaml.YAMLError as err:
        raise error(file, [_yaml_error(err)]) from None
    except FileNotFoundError:
        raise error(file, [f"file not found (looked for {Path(path).resolve()})"]) from None
    except IsADirectoryError:
        raise error(file, ["is a directory, not a YAML file"]) from None
    except UnicodeDecodeError as err:
        raise error(file, [f"not UTF-8 text ({err.reason} at byte {err.start})"]) from None
    except OSError as err:
        raise error(file, [f"cannot read the file ({err.strerror or err})"]) from None
    problems = _duplicate_keys(root, ())
    if problems:
        raise error(file, problems)
    if not isinstance(raw, dict):
        kind = "an empty file" if raw is None else f"a {type(raw).__name__}"
        raise error(file, [f"(top level): expected a mapping of {expected}, got {kind}"])
    return file, raw, root


def validate_yaml_mapping(model: type[BaseModel], file: str, raw: dict, root: yaml.Node | None,
                          overridden: list[tuple] | None = None, context: Mapping[str, Any] | None = None,
                          error: type[PipelineConfigError] = PipelineConfigError) -> Any:
    """``model.model_validate(raw)`` (with the validation ``context``), every problem turned into
    one line naming the field path, the bad value and its line in ``file`` (``error``)."""
    try:
        return model.model_validate(raw, context=context)
    except ValidationError as err:
        raise error(file, _format_errors(err.errors(include_url=False), raw, root, overridden or [], model)) from None


RUNTIME_SECTIONS = ("ray", "tracking")  # where and how a run runs, not what it computes


def config_sha256(config: PipelineConfig, exclude: Iterable[str] = ()) -> str:
    """sha256 (hex) of the normalised config: canonical JSON (sorted keys) of every validated field.

    ``exclude`` leaves top-level fields out (e.g. ``RUNTIME_SECTIONS`` to identify a run
    independently of the cluster it runs on and of where it is tracked).
    """
    data = config.model_dump(mode="json", exclude=set(exclude) or None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _unshared(value: Any) -> Any:
    """A copy in which no two places share a dict or list: YAML aliases (*anchor) load as one shared
    object, and an override of one generation's field must not change the others."""
    if isinstance(value, dict):
        return {key: _unshared(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unshared(item) for item in value]
    return value


def _apply_overrides(file: str, raw: dict, overrides: Mapping[str, Any]) -> tuple[dict, list[tuple]]:
    raw = _unshared(raw)
    applied = []
    for key, value in overrides.items():
        if value is None:
            continue
        parts: list[Any] = [int(p) if p.isdigit() else p for p in str(key).split(".")]
        node: Any = raw
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            if isinstance(node, dict) and isinstance(part, str):
                if last:
                    node[part] = _unshared(value)
                else:
                    node = node.setdefault(part, {})
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                if last:
                    node[part] = _unshared(value)
                else:
                    node = node[part]
            else:
                raise PipelineConfigError(file, [f"override {key}: {_path(tuple(parts[:depth])) or '(top level)'} "
                                                 f"has no field {part!r}"])
        applied.append(tuple(parts))
    return raw, applied


def _limit_problem(err: YAMLLimitError) -> str:
    """A file past a bound of ``orchestrator.limits``: the field path, the bound, the value, the line."""
    line = f" [line {err.line}]" if err.line is not None else ""
    return f"{_path(err.loc) or '(file)'}: {err.message} (got {err.value}){line}"


def _yaml_error(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context_mark = getattr(err, "context_mark", None)
    if context and context_mark is not None and mark is not None and context_mark is not mark:
        context += f" started at line {context_mark.line + 1}, column {context_mark.column + 1}"
    return f"{where}YAML syntax error: {problem}" + (f" ({context})" if context else "")


def _duplicate_keys(node: yaml.Node | None, loc: tuple) -> list[str]:
    """A YAML mapping with the same key twice keeps the last value silently: report it."""
    problems = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name is not None and name != "<<":
                if name in seen:
                    problems.append(f"{_path((*loc, name))}: duplicate key (also at line {seen[name]}; YAML would keep "
                                    f"only the last value) [line {key.start_mark.line + 1}]")
                else:
                    seen[name] = key.start_mark.line + 1
            problems += _duplicate_keys(value, (*loc, name))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            problems += _duplicate_keys(item, (*loc, i))
    return problems


def _format_errors(errors: list[dict[str, Any]], raw: Any, root: yaml.Node | None, overridden: list[tuple],
                   model: type[BaseModel]) -> list[str]:
    lines = []
    for err in errors:
        if err.get("type") == "config_problems":
            nested = [{**p, "loc": (*err["loc"], *p["loc"])} for p in err["ctx"]["problems"]]
            lines += _format_errors(nested, raw, root, overridden, model)
            continue
        loc = _display_loc(tuple(err["loc"]), raw)
        msg = str(err["msg"])
        for prefix in ("Value error, ", "Assertion failed, "):
            if msg.startswith(prefix):
                msg = msg[len(prefix):]
        if err.get("type") == "extra_forbidden":
            allowed = err.get("allowed")
            if allowed is None:
                allowed = _fields_at(model, tuple(err["loc"])[:-1])
            msg = f"unknown field{_suggest(str(loc[-1]), allowed or [])}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
        msg = _with_value(msg, err)
        if any(loc[: len(o)] == o for o in overridden):
            msg += " [set by override]"
        else:
            line = _line_of(root, loc)
            if line is not None:
                msg += f" [line {line}]"
        lines.append(f"{_path(loc) or '(top level)'}: {msg}")
    return lines


def _display_loc(loc: tuple, raw: Any) -> tuple:
    """The error location as the user wrote it: elements pydantic adds that are not in the input
    (``ids`` of ``classes: [..]``) are dropped when the next element continues the input path."""
    out: list[Any] = []
    node = raw
    for i, element in enumerate(loc):
        nxt = loc[i + 1] if i + 1 < len(loc) else None
        if isinstance(node, dict) and element in node:
            node = node[element]
        elif isinstance(node, list) and isinstance(element, int) and -len(node) <= element < len(node):
            node = node[element]
        elif isinstance(element, str) and nxt is not None and (
            (isinstance(node, dict) and nxt in node) or (isinstance(node, list) and isinstance(nxt, int))
        ):
            continue
        else:
            node = None
        out.append(element)
    return tuple(out)


def _line_of(root: yaml.Node | None, loc: tuple) -> int | None:
    """1-based line of the deepest YAML node on the path ``loc`` (the key's line for mappings)."""
    node, line = root, None
    for element in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(element)), None)
            key = next((k for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(element)), None)
            if match is None:
                break
            node, line = match, key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(element, int) and 0 <= element < len(node.value):
            node = node.value[element]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _fields_at(model: Any, loc: tuple) -> list[str] | None:
    """Field names of the pydantic model reached from ``model`` along ``loc``, if any."""
    tp: Any = model
    for element in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if isinstance(element, str) and element in tp.model_fields:
                tp = tp.model_fields[element].annotation
            continue  # an element pydantic adds (e.g. ``ids`` of a list selection): stay on this model
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (list, tuple) and args:
            tp = args[0]
        elif origin is dict and len(args) == 2:
            tp = args[1]
        else:
            return None
    tp = _unwrap(tp)
    return list(tp.model_fields) if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _path(loc: Iterable[Any]) -> str:
    """('generations', 1, 'method', 'params', 'lam') → 'generations[1].method.params.lam'."""
    out = ""
    for element in loc:
        if isinstance(element, int):
            out += f"[{element}]"
        else:
            out += f".{element}" if out else str(element)
    return out


def _with_value(msg: str, err: Mapping[str, Any]) -> str:
    """``msg (got <input>)`` when the error carries the offending input."""
    if "input" not in err or err.get("type") == "missing":
        return msg
    value, shown = err["input"], _show(err["input"])
    # a string the message already quotes is not repeated (numbers always are: "> 0 (got 0)")
    if isinstance(value, str) and (shown in msg or repr(value) in msg):
        return msg
    return f"{msg} (got {shown})"


def _show(value: Any, limit: int = 80) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _suggest(word: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(candidates), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _scheme(url: str) -> str | None:
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", url)
    return match.group(1).lower() if match else None


def _local_path(storage: str) -> str:
    return storage[len("file://"):] if storage.startswith("file://") else storage
