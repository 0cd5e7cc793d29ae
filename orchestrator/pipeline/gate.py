"""The deployment gate: what must hold before a generation serves (``GateSpec``), and the decision.

The gate runs after a generation's gallery plan and before any shard changes
(``gate:<gallery>:<generation>``, its measurement committed in the lineage):

- criterion: for every older generation whose items the plan leaves in the gallery, the
  empirical compatibility criterion M(new → old) > M(old → old) (``search.admission``), as the
  router would admit them;
- quality: the served gallery's mAP after the planned backfill, predicted on the ``gallery-eval``
  sample, against what the serving generation's report measured, within ``max_quality_drop``;
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


class DeploymentHeld(RuntimeError):
    """A generation failed its gate with action ``hold``: it was not deployed."""


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


def decide(measurement: GateMeasurement, spec: GateSpec) -> GateDecision:
    """The gate's decision for ``measurement`` under ``spec`` (pure: no I/O)."""
    failures = []
    if spec.criterion:
        failures += [f"{measurement.generation} → {old}: {reason}"
                     for old, admitted, reason in measurement.verdicts if not admitted]
    floor = None if measurement.serving_quality is None else measurement.serving_quality - spec.max_quality_drop
    if measurement.predicted is not None and floor is not None and measurement.predicted < floor:
        failures.append(f"served mAP after the plan {measurement.predicted:.4f} < {floor:.4f} "
                        f"({measurement.serving} serves {measurement.serving_quality:.4f}, "
                        f"max_quality_drop {spec.max_quality_drop:g})")
    own_quality_fails = spec.min_p_up is not None and measurement.p_up is not None and measurement.p_up < spec.min_p_up
    if own_quality_fails:
        failures.append(f"own mAP against the unaligned reference: P_up {measurement.p_up:+.3f} < min_p_up "
                        f"{spec.min_p_up:g}")
    if not failures:
        return GateDecision(measurement.generation, (), "deploy")
    if spec.action == "full_backfill":  # a full re-embed mends neither the own quality nor a worse full gallery
        full_fails = measurement.full_backfill is not None and floor is not None and measurement.full_backfill < floor
        if full_fails:
            failures.append(f"a full backfill would serve mAP {measurement.full_backfill:.4f} < {floor:.4f} as well")
        if own_quality_fails or full_fails:
            return GateDecision(measurement.generation, tuple(failures), "hold")
    return GateDecision(measurement.generation, tuple(failures), spec.action)
