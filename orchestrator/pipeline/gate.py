"""The deployment gate: what must hold before a generation serves (``GateSpec``), and the decision.

The gate runs after a generation's gallery plan and before any shard changes
(``gate:<gallery>:<generation>``, its measurement committed in the lineage):

- criterion: for every older generation whose items the plan leaves in the gallery, the
  empirical compatibility criterion M(new → old) > M(old → old) (``search.admission``), as the
  router would admit them;
- quality: the served gallery's mAP after the planned backfill, predicted on the ``gallery-eval``
  sample, against what the serving generation's report measured, within ``max_quality_drop`` plus
  ``noise_sigmas`` standard errors of the sample (the paired per-query AP differences against the
  gallery as served now: a drop the sample cannot tell from its noise is not one);
- own quality (``min_p_up``, off by default): the generation's P_up on mAP against the unaligned
  reference (``pipeline.quality_warning``), at least ``min_p_up``.

Action ``full_backfill`` re-plans a failed generation as a full re-embed, which removes the older
generations (so the criterion) and the mixed gallery from the question, but not the generation's
own quality: it deploys only when the fully re-embedded gallery, predicted on the same sample,
serves within ``max_quality_drop`` of what serves now and the own-quality check passes; otherwise
the generation is held, with the reason.

The decision is taken from the committed measurement and the *current* ``GateSpec`` on every run,
so a held generation can be re-run with another action without measuring again; it is recorded
with the deployment step (``deploy:<generation>``: its outputs, or the failed step's error).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.config import GateSpec
from orchestrator.errors import ExitCode, OrchestratorError


class DeploymentHeld(OrchestratorError, RuntimeError):
    """A generation failed its gate with action ``hold``: it was not deployed."""

    exit_code = ExitCode.HELD
    reported_as = "held"


@dataclass(frozen=True)
class GateMeasurement:
    """What the gate of ``generation`` found (JSON-able: the gate step's outputs).

    serving:          the generation serving when the gate ran.
    verdicts:         per older generation left in the gallery: [generation, admitted, reason].
    predicted:        mAP of the served gallery after the plan, on the sample (None: unmeasured).
    serving_quality:  mAP the serving generation's report measured on its gallery (None: unmeasured).
    unmeasured:       why the quality was not measured ("" when it was).
    p_up:             the generation's P_up on mAP against the reference (None: no reference, or
                      not measured when the gate ran).
    full_backfill:    mAP of the served gallery were every item re-embedded by the generation, on the
                      same sample (None: unmeasured, or a gate measured before it was recorded).
    no_backfill:      mAP of the gallery as it is, nothing re-embedded, searched by the generation's
                      queries, on the same sample (None: as ``full_backfill``).
    served_now:       mAP of the gallery as served now (the serving generation's queries, the stored
                      shards it can compare with) on the same sample: ``serving_quality`` again,
                      unless the gallery changed since that report (None: as ``full_backfill``).
    predicted_se:     standard error of ``predicted`` − ``served_now``, paired query by query on the
                      sample (``metrics.paired_difference_standard_error``; None: as ``full_backfill``).
    full_backfill_se: the same for ``full_backfill``.
    """

    generation: str
    serving: str
    metric: str
    verdicts: list[list[Any]] = field(default_factory=list)
    predicted: float | None = None
    serving_quality: float | None = None
    unmeasured: str = ""
    p_up: float | None = None
    full_backfill: float | None = None
    no_backfill: float | None = None
    served_now: float | None = None
    predicted_se: float | None = None
    full_backfill_se: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GateMeasurement:
        return cls(**data)


@dataclass(frozen=True)
class GateDecision:
    """``action``: ``deploy`` (every check passed) or the configured action for a failure."""

    generation: str
    failures: tuple[str, ...]
    action: str

    @property
    def passed(self) -> bool:
        return not self.failures

    def describe(self) -> str:
        if self.passed:
            return f"gate of {self.generation}: passed"
        return f"gate of {self.generation}: failed ({'; '.join(self.failures)}); action: {self.action}"

    def to_json(self) -> dict[str, Any]:
        return {"failures": list(self.failures), "action": self.action}


def wasted_backfill(measurement: GateMeasurement) -> str | None:
    """A note (not a failure) when the planned backfill is predicted to serve below what the same
    generation would serve with nothing re-embedded: re-embedding work that makes retrieval worse
    than no work at all (another ``backfill.order`` or budget would do better). None otherwise."""
    plan, nothing = measurement.predicted, measurement.no_backfill
    if plan is None or nothing is None or plan >= nothing:
        return None
    return (f"gate of {measurement.generation}: the planned backfill serves mAP {plan:.4f}, below the {nothing:.4f} "
            "of re-embedding nothing; another backfill.order or budget would serve better")


def drop_within_noise(measurement: GateMeasurement, spec: GateSpec, decision: GateDecision) -> str | None:
    """A note (not a failure) when the gallery ``decision`` deploys (the planned one, or the fully
    re-embedded one when it escalates to ``full_backfill``) is predicted below the floor but within
    the noise margin, so it deploys on ``noise_sigmas``: the user sees the drop let through and
    why. None otherwise (held, forced, or no drop below the floor)."""
    escalated = decision.action == "full_backfill"
    if decision.action not in ("deploy", "full_backfill"):
        return None
    quality = measurement.full_backfill if escalated else measurement.predicted
    error = measurement.full_backfill_se if escalated else measurement.predicted_se
    serving = measurement.serving_quality
    if quality is None or serving is None or quality >= serving - spec.max_quality_drop:
        return None
    what = "a full backfill would serve" if escalated else "served mAP after the plan"
    return (f"gate of {measurement.generation}: {what} {quality:.4f}, {serving - quality:.4f} below what "
            f"{measurement.serving} serves ({serving:.4f}), within the sample's noise ({spec.noise_sigmas:g} × SE "
            f"{error:.4f}, gate.noise_sigmas): not held for it")


def noise_unmeasured(measurement: GateMeasurement, spec: GateSpec) -> str | None:
    """A note when the quality is judged with no standard error (a gate measured before this version
    recorded them, or fewer than two scored queries): the margin is then 0, any drop below the
    floor holds. None otherwise (measured, unmeasured quality, or ``noise_sigmas`` 0)."""
    if not spec.noise_sigmas or measurement.predicted is None or measurement.predicted_se is not None:
        return None
    return (f"gate of {measurement.generation}: the sample's noise was not measured (a gate recorded before this "
            "version, or fewer than two scored queries): any drop below the floor holds")


def _below_floor(quality: float | None, standard_error: float | None, floor: float | None,
                 spec: GateSpec) -> str | None:
    """Why ``quality`` (mAP predicted on the sample) counts as below ``floor``, or None: it must fall
    below it by more than ``spec.noise_sigmas`` standard errors (a drop within the sample's noise is
    no evidence of one; an unmeasured error counts as 0)."""
    if quality is None or floor is None:
        return None
    margin = spec.noise_sigmas * (standard_error or 0.0)
    if quality >= floor - margin:
        return None
    noise = f" − {spec.noise_sigmas:g} × SE {standard_error:.4f}" if margin else ""
    return f"{quality:.4f} < {floor:.4f}{noise}"


def decide(measurement: GateMeasurement, spec: GateSpec) -> GateDecision:
    """The gate's decision for ``measurement`` under ``spec`` (pure: no I/O)."""
    failures = []
    if spec.criterion:
        failures += [f"{measurement.generation} → {old}: {reason}"
                     for old, admitted, reason in measurement.verdicts if not admitted]
    floor = None if measurement.serving_quality is None else measurement.serving_quality - spec.max_quality_drop
    planned_drop = _below_floor(measurement.predicted, measurement.predicted_se, floor, spec)
    if planned_drop:
        failures.append(f"served mAP after the plan {planned_drop} "
                        f"({measurement.serving} serves {measurement.serving_quality:.4f}, "
                        f"max_quality_drop {spec.max_quality_drop:g})")
    own_quality_fails = spec.min_p_up is not None and measurement.p_up is not None and measurement.p_up < spec.min_p_up
    if own_quality_fails:
        failures.append(f"own mAP against the unaligned reference: P_up {measurement.p_up:+.3f} < min_p_up "
                        f"{spec.min_p_up:g}")
    if not failures:
        return GateDecision(measurement.generation, (), "deploy")
    if spec.action == "full_backfill":  # a full re-embed mends neither the own quality nor a worse full gallery
        full_drop = _below_floor(measurement.full_backfill, measurement.full_backfill_se, floor, spec)
        full_fails = full_drop is not None
        if full_fails:
            failures.append(f"a full backfill would serve mAP {full_drop} as well")
        if own_quality_fails or full_fails:
            return GateDecision(measurement.generation, tuple(failures), "hold")
    return GateDecision(measurement.generation, tuple(failures), spec.action)
