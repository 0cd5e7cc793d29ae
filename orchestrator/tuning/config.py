"""Tune files: the typed YAML that ``orchestrator tune`` runs, and its loader.

A tune file names a pipeline file, the update to tune in it (``transition``: a candidate generation
and its parent), a search space over the candidate method's typed parameters, how to search
(Tune's variant generator or Optuna), the early-stopping scheduler, resources per trial and the
objective. ``pipelines/tune.yaml`` is the commented reference::

    name: hbct-lam-clip
    pipeline: pipelines/lifelong.yaml
    transition: {parent: g0-old, candidate: g1}
    space:
      lam:  {loguniform: [0.03, 3.0]}
      clip: {grid: [1.1, 1.2, 1.4]}
    search: {algorithm: random, num_samples: 4, seed: 0}
    scheduler: {kind: asha, grace_period: 4, reduction_factor: 3}
    resources: {cpu: 1}
    objective:
      maximize: cross_map
      subject_to: {metric: p_up_map, min: -0.01}

Validation reuses the pipeline machinery (``orchestrator.config``): unknown fields are errors and
every problem is one line naming the file, the field path, the bad value and its line. The file
is checked against the pipeline it names: the candidate exists and has that parent; every space
entry is a parameter of the candidate's method (``Params``: unknown names rejected with a
suggestion) and every value, bound or choice validates there; P_com / P_up objectives need the
pipeline's evaluation reference.

Metric names (``METRIC_NAMES``): ``<kind>_<metric>`` with kind ``self`` (candidate queries on the
candidate's gallery), ``cross`` (candidate queries on the parent's gallery), ``p_com``, ``p_up``
(HBCT eq. 14 and its table form, normalised by the evaluation reference), and metric ``cmc@1``,
``cmc@5`` or ``map``.

Decisions:
- The pipeline path, like every relative path of the project, is relative to the working
  directory (``orchestrator tune pipelines/tune.yaml`` runs from the project root).
- The candidate trains for its own ``training.epochs``; that is ASHA's ``max_t``, so the best
  configuration pasted back into the pipeline trains exactly as its trial did.
- A post-hoc candidate (``orchestrator.methods.posthoc``: a given encoder, frozen, and a fitted
  map; e.g. the weight t of ``slerp``) trains no epoch: each trial fits its map once and reports
  once (``trial_reports``), so ASHA has nothing to stop early (a ``grace_period`` above 1 is refused).
- ``algorithm: random`` is Tune's variant generator: ``grid`` entries are crossed in full and
  repeated ``num_samples`` times, the other entries sampled once per trial. Optuna (TPE) samples
  every entry, so it takes ``choice`` but not ``grid``.
"""
from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, model_validator

from orchestrator import limits
from orchestrator.config import (
    GenerationSpec,
    PipelineConfig,
    PipelineConfigError,
    StrictModel,
    load_pipeline,
    posthoc,
    problem,
    problems_from,
    raise_problems,
    read_yaml_mapping,
    suggest,
    unwrap,
    validate_yaml_mapping,
)
from orchestrator.methods.registry import method_description
from orchestrator.metrics import METRICS, NORMALISED_SCORES, UPDATE_SCORES
from orchestrator.names import Name

KINDS = UPDATE_SCORES
METRIC_NAMES: tuple[str, ...] = tuple(f"{kind}_{metric}" for kind in KINDS for metric in METRICS)
MetricName = Literal[METRIC_NAMES]  # type: ignore[valid-type]
_SAMPLED = ("uniform", "loguniform")
_KINDS_OF_RANGE = ("grid", "choice", "uniform", "loguniform")


class TuneFileError(PipelineConfigError):
    """A tune file that cannot be used; ``str(error)`` is one line per problem (file: field: ...)."""


def trial_reports(candidate: GenerationSpec) -> int:
    """How often a trial of ``candidate`` reports: once per training epoch, or once for a post-hoc
    method, which fits its map without training an epoch."""
    return candidate.training.epochs if posthoc.trains_encoder(candidate) else 1


class ParameterRange(StrictModel):
    """The values one method parameter takes in the sweep; exactly one of:

    grid:       every value, each in its own trials (Tune ``grid_search``).
    choice:     one value drawn per trial (``tune.choice``; categorical for Optuna).
    uniform:    [low, high], a float drawn uniformly.
    loguniform: [low, high], 0 < low, a float whose logarithm is uniform (λ, τ, β).
    """

    grid: list[Any] | None = Field(None, min_length=1, max_length=limits.MAX_SPACE_VALUES)
    choice: list[Any] | None = Field(None, min_length=1, max_length=limits.MAX_SPACE_VALUES)
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ParameterRange:
        given = [kind for kind in _KINDS_OF_RANGE if getattr(self, kind) is not None]
        problems = []
        if len(given) != 1:
            problems.append(problem((), "give exactly one of grid: [...], choice: [...], uniform: [low, high], "
                                    "loguniform: [low, high]" + (f" (got {', '.join(given)})" if given else "")))
        for kind in _SAMPLED:
            bounds = getattr(self, kind)
            if bounds is not None and not bounds[0] < bounds[1]:
                problems.append(problem((kind,), "needs low < high", list(bounds)))
        if self.loguniform is not None and self.loguniform[0] <= 0:
            problems.append(problem(("loguniform",), "needs 0 < low (a log scale)", list(self.loguniform)))
        raise_problems(problems)
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in _KINDS_OF_RANGE if getattr(self, kind) is not None)

    @property
    def values(self) -> list[Any]:
        """The grid or choice values, or the two bounds."""
        return list(getattr(self, self.kind))


class Transition(StrictModel):
    """The update tuned: a candidate generation of the pipeline and its parent.

    candidate: the generation whose method parameters are tuned (it needs a parent).
    parent:    the generation it is aligned to; default (and if given, it must be) its parent in
               the pipeline.
    """

    candidate: str
    parent: str | None = None


class SearchSettings(StrictModel):
    """How trial configurations are drawn.

    algorithm:   ``random`` (Tune's variant generator; grids crossed in full) or ``optuna`` (TPE).
    num_samples: trials (``random``: repeats of the whole grid, each with fresh samples).
    seed:        seed of the sampler, so a sweep draws the same configurations when run again."""

    algorithm: Literal["random", "optuna"] = "random"
    num_samples: int = Field(1, ge=1, le=limits.MAX_NUM_SAMPLES)
    seed: int = 0


class SchedulerSettings(StrictModel):
    """Which trials stop early.

    kind:             ``asha`` (asynchronous successive halving on the per-epoch objective) or
                         ``fifo`` (every trial runs all its epochs).
    grace_period:     epochs every trial runs before ASHA may stop it.
    reduction_factor: ASHA keeps the best 1/reduction_factor of the trials at each rung."""

    kind: Literal["asha", "fifo"] = "asha"
    grace_period: int = Field(1, ge=1, le=limits.MAX_GRACE_PERIOD)
    reduction_factor: float = Field(3.0, gt=1)


class Resources(StrictModel):
    """Resources of one trial (one training process).

    cpu: CPUs per trial.
    gpu: GPUs per trial (fractions share a GPU).
    """

    cpu: float = Field(1.0, gt=0, le=limits.MAX_CPUS)
    gpu: float = Field(0.0, ge=0, le=limits.MAX_GPUS)


class Constraint(StrictModel):
    """``metric`` ≥ ``min`` or ``metric`` ≤ ``max`` (exactly one bound).

    metric: the constrained metric (``<kind>_<metric>``, see ``maximize``).
    min:    the lowest feasible value.
    max:    the highest feasible value.
    """

    metric: MetricName
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _one_bound(self) -> Constraint:
        if (self.min is None) == (self.max is None):
            raise_problems([problem((), "give exactly one bound: min or max")])
        return self

    def violation(self, value: float) -> float:
        """How far ``value`` is outside the bound (0 when it satisfies it)."""
        return max(0.0, self.min - value) if self.min is not None else max(0.0, value - self.max)


class Objective(StrictModel):
    """What the sweep looks for; exactly one of:

    maximize:   one metric, optionally ``subject_to`` a constraint on another; the scalar Tune
                optimises is then ``value − penalty · violation`` (``orchestrator.tuning.objective``),
                and the best trial is the best feasible one.
    pareto:     two metrics (e.g. ``[self_map, cross_map]``): the result is their Pareto front; Tune
                optimises their mean, and the best configuration is the front's trial with the
                largest mean.
    subject_to: the constraint of ``maximize`` (optional).
    penalty:    the weight of the constraint's violation in the scalar Tune optimises.
    """

    maximize: MetricName | None = None
    subject_to: Constraint | None = None
    penalty: float = Field(10.0, gt=0)
    pareto: tuple[MetricName, MetricName] | None = None

    @model_validator(mode="after")
    def _one_goal(self) -> Objective:
        problems = []
        if (self.maximize is None) == (self.pareto is None):
            problems.append(problem((), "give exactly one of maximize: <metric> or pareto: [<metric>, <metric>]"))
        if self.subject_to is not None and self.maximize is None:
            problems.append(problem(("subject_to",), "a constraint goes with maximize", self.subject_to.metric))
        if self.pareto is not None and self.pareto[0] == self.pareto[1]:
            problems.append(problem(("pareto",), "needs two different metrics", list(self.pareto)))
        raise_problems(problems)
        return self

    @property
    def kind(self) -> Literal["maximize", "constrained", "pareto"]:
        if self.pareto is not None:
            return "pareto"
        return "maximize" if self.subject_to is None else "constrained"

    @property
    def metrics(self) -> list[str]:
        """Every metric the objective reads."""
        if self.pareto is not None:
            return list(self.pareto)
        return [self.maximize] + ([self.subject_to.metric] if self.subject_to is not None else [])


class TuneSpec(StrictModel):
    """A whole tune file (module docstring).

    name:                  the sweep, a safe path component (``orchestrator.names``); its folder is ``<pipeline storage>/tune/<name>``.
    description:           free text.
    pipeline:              the pipeline file (relative to the working directory).
    max_concurrent_trials: trials at once; None: as many as the cluster's CPUs (GPUs) fit.
    max_failures:          retries of a trial that raised.
    """

    name: Name
    description: str = ""
    pipeline: str
    transition: Transition
    space: dict[str, ParameterRange] = Field(min_length=1)
    search: SearchSettings = Field(default_factory=SearchSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    resources: Resources = Field(default_factory=Resources)
    max_concurrent_trials: int | None = Field(None, ge=1, le=limits.MAX_WORKERS)
    max_failures: int = Field(0, ge=0, le=limits.MAX_FAILURES)
    objective: Objective

    @model_validator(mode="after")
    def _check_against_pipeline(self, info: ValidationInfo) -> TuneSpec:
        problems = []
        if self.search.algorithm == "optuna":
            problems += [problem(("space", name, "grid"), "Optuna samples every parameter: use choice: [...] "
                                 "(or algorithm: random for a full grid)", entry.grid)
                         for name, entry in self.space.items() if entry.grid is not None]
        pipeline: PipelineConfig | None = (info.context or {}).get("pipeline")
        if pipeline is not None:
            transition_problems = self._check_transition(pipeline)
            problems += transition_problems
            if not transition_problems:
                candidate = pipeline.generation(self.transition.candidate)
                problems += self._check_space(candidate) + self._check_scheduler(candidate)
            problems += self._check_objective(pipeline)
        raise_problems(problems)
        return self

    def _check_transition(self, pipeline: PipelineConfig) -> list[dict[str, Any]]:
        names = [g.name for g in pipeline.generations]
        name, where = self.transition.candidate, ("transition", "candidate")
        if name not in names:
            return [problem(where, f"no generation of this name in {self.pipeline}{suggest(name, names)}; "
                                    f"generations: {', '.join(names)}", name)]
        candidate = pipeline.generation(name)
        if candidate.parent is None:
            return [problem(where, "a sweep tunes an update: the candidate needs a parent generation", name)]
        if name == pipeline.evaluation.reference:
            return [problem(where, "the evaluation reference φ_* is unaligned, not an update to tune", name)]
        if self.transition.parent not in (None, candidate.parent):
            return [problem(("transition", "parent"), f"{name!r} has the parent {candidate.parent!r} in "
                                                      f"{self.pipeline}", self.transition.parent)]
        return []

    def _check_scheduler(self, candidate: GenerationSpec) -> list[dict[str, Any]]:
        scheduler = self.scheduler
        if scheduler.kind == "asha" and scheduler.grace_period > trial_reports(candidate):
            if not posthoc.trains_encoder(candidate):
                return [problem(("scheduler", "grace_period"), f"the candidate's method {candidate.method.name!r} trains "
                                                                "no encoder: each trial fits its map and reports once, so "
                                                                "the grace period can be 1 at most (or use kind: fifo)",
                                scheduler.grace_period)]
            return [problem(("scheduler", "grace_period"), f"longer than the candidate's training "
                                                            f"({candidate.training.epochs} epochs)", scheduler.grace_period)]
        return []

    def _check_space(self, candidate: GenerationSpec) -> list[dict[str, Any]]:
        """Names and values against the candidate method's ``Params``; values stored normalised."""
        method = candidate.method.name
        params_model = method_description(method).Params
        fields = params_model.model_fields
        problems = []
        for name, entry in self.space.items():
            where = ("space", name)
            if name not in fields:
                problems.append(problem(where, f"not a parameter of method {method!r}{suggest(name, fields)}; "
                                                f"parameters: {', '.join(fields)}", name))
                continue
            if entry.kind in _SAMPLED and unwrap(fields[name].annotation) is not float:
                problems.append(problem((*where, entry.kind), f"draws floats, but {method}.{name} is "
                                        f"{_type_name(fields[name].annotation)}: use grid or choice", entry.values))
                continue
            normalised = []
            for i, value in enumerate(entry.values):
                try:
                    checked = params_model.model_validate({**candidate.method.params, name: value})
                except ValidationError as err:
                    for found in problems_from(err, params_model):
                        problems.append({**found, "loc": (*where, entry.kind, i)})
                    continue
                normalised.append(checked.model_dump(mode="json")[name])
            if len(normalised) == len(entry.values):
                setattr(entry, entry.kind, tuple(normalised) if entry.kind in _SAMPLED else normalised)
        return problems

    def _check_objective(self, pipeline: PipelineConfig) -> list[dict[str, Any]]:
        if pipeline.evaluation.reference is not None:
            return []
        return [problem(("objective",), f"{metric} is normalised by the evaluation reference φ_*, but "
                                         f"{self.pipeline} names none (evaluation.reference)", metric)
                for metric in self.objective.metrics if metric.startswith(NORMALISED_SCORES)]


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is Literal:
        return "one of " + "|".join(str(a) for a in typing.get_args(annotation))
    return getattr(unwrap(annotation), "__name__", str(annotation))


@dataclass(frozen=True)
class TuneFile:
    """A validated tune file with the pipeline it names."""

    path: str
    spec: TuneSpec
    pipeline: PipelineConfig

    @property
    def candidate(self) -> GenerationSpec:
        return self.pipeline.generation(self.spec.transition.candidate)

    @property
    def reports(self) -> int:
        """``trial_reports`` of the candidate: ASHA's ``max_t``."""
        return trial_reports(self.candidate)

    @property
    def parent(self) -> GenerationSpec:
        return self.pipeline.generation(self.candidate.parent)


def load_tune_file(path: str | Path, pipeline_overrides: Mapping[str, Any] | None = None) -> TuneFile:
    """Read and validate a tune file and the pipeline file it names, with ``pipeline_overrides``
    (dotted field paths → values, as ``load_pipeline`` takes them: ``orchestrator tune --storage /
    --ray-address / --set``) applied to that pipeline.

    Raises ``TuneFileError`` (one line per problem: file, field path, bad value, line) for the tune
    file, and ``PipelineConfigError`` naming the pipeline file for problems there.
    """
    file, raw, root = read_yaml_mapping(path, "tune fields (name, pipeline, transition, space, objective, ...)",
                                        error=TuneFileError)
    pipeline = None
    pipeline_path = raw.get("pipeline")
    if isinstance(pipeline_path, str):
        if not Path(pipeline_path).is_file():
            line = next((k.start_mark.line + 1 for k, _v in root.value if k.value == "pipeline"), None)
            raise TuneFileError(file, [f"pipeline: no such pipeline file (looked for {Path(pipeline_path).resolve()}) "
                                       f"[line {line}]"])
        pipeline = load_pipeline(pipeline_path, pipeline_overrides)
    spec = validate_yaml_mapping(TuneSpec, file, raw, root, context={"pipeline": pipeline}, error=TuneFileError)
    return TuneFile(file, spec, pipeline)
