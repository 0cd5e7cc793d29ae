"""How a generation is deployed: its backfill policy and the gate it must pass before it serves."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.backfill.orders import ORDERS
from orchestrator.config.problems import StrictModel, problem, raise_problems


class BackfillPolicy(StrictModel):
    """How much of the gallery is re-embedded by a new generation before/while it serves.

    policy:      none (search older shards through compatibility), full (re-embed every shard) or
                 partial (a ``budget``).
    budget:      the fraction in (0, 1] of the gallery to re-embed (partial only).
    budget_unit: the budget counts items or whole shards.
    order:       which items / shards first, an order of ``backfill.orders``: uncertainty (highest
                 uncertainty of the old embedding), class_mean_distance (largest distance to the
                 class means), random (seeded), or least_compatible: the items of the stored
                 generation the new one searches worst (lowest recorded cross-model
                 ``search.criterion_metric``) first, random within a generation. Applies to
                 partial and full (full: the order shards are refreshed in).
    """

    policy: Literal["none", "full", "partial"] = "none"
    budget: float | None = Field(None, gt=0, le=1)
    budget_unit: Literal["items", "shards"] = "items"
    order: str = Field("random", json_schema_extra={"enum": list(ORDERS)})

    @field_validator("order")
    @classmethod
    def _known_order(cls, order: str) -> str:
        if order not in ORDERS:
            raise ValueError(f"must be one of {', '.join(ORDERS)}")
        return order

    @model_validator(mode="after")
    def _check_budget(self) -> BackfillPolicy:
        problems = []
        if self.policy == "partial" and self.budget is None:
            problems.append(problem(("budget",), "policy 'partial' needs a budget: a fraction in (0, 1] of the items or shards"))
        if self.policy != "partial" and self.budget is not None:
            problems.append(problem(("budget",), f"a budget applies to policy 'partial' only (policy is {self.policy!r})", self.budget))
        # defaults are accepted (a normalised dump spells them out), other values are contradictions
        if self.policy != "partial" and self.budget_unit != "items":
            problems.append(problem(("budget_unit",), f"applies to policy 'partial' only (policy is {self.policy!r})", self.budget_unit))
        if self.policy == "none" and self.order != "random":
            problems.append(problem(("order",), "policy 'none' re-embeds nothing, so it has no order", self.order))
        raise_problems(problems)
        return self


class GateSpec(StrictModel):
    """What must hold before a generation serves (checked after its gallery plan, before any shard
    changes; the first served generation has nothing to compare with and passes).

    criterion:        the update passes the empirical criterion M(new→served) > M(served→served)
                      against the generation serving now, on ``search.criterion_metric``.
    max_quality_drop: the served gallery's predicted quality after the planned backfill (mAP on the
                      ``gallery-eval`` sample: shards as the plan leaves them, each searched along
                      its comparison path) may be below the quality the serving generation's report
                      measured by at most this much. Unmeasurable on an unlabelled gallery (the
                      gate then says so and checks the criterion only).
    noise_sigmas:     a predicted quality counts as below that floor only when it is below it by more
                      than this many standard errors of its paired per-query difference from the
                      gallery as served now, on the same sample (a drop the sample cannot tell from
                      its noise is no evidence of one: about 2.3 % of equal galleries would be held
                      at 2). 0: any drop below the floor holds, however small the sample.
    min_p_up:         the generation's own mAP may fall below the unaligned reference's
                      (``evaluation.reference``) by at most this share: P_up ≥ min_p_up (hbct.md
                      eq. 15; the quantity ``evaluation.warn_p_up`` warns about). None (default): not
                      checked. The reference must come before the generation in ``generations`` to
                      be measured when the gate runs; otherwise the gate says it did not check.
    action:           when a check fails: ``hold`` (do not deploy; the serving generation keeps
                      serving, the run stops with a non-zero exit), ``full_backfill`` (re-plan as a
                      full re-embed, then deploy; held instead when the fully re-embedded gallery,
                      predicted on the same sample, would serve below the floor, or when
                      ``min_p_up`` fails: a re-embed mends neither) or ``force`` (deploy anyway,
                      recorded).
    """

    criterion: bool = True
    max_quality_drop: float = Field(0.0, ge=0, le=1)
    noise_sigmas: float = Field(2.0, ge=0, le=10)
    min_p_up: float | None = Field(None, ge=-1, le=0)
    action: Literal["hold", "full_backfill", "force"] = "hold"
