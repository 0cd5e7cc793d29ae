"""Which older generations' shards the serving generation may search: the compatibility criterion.

A shard embedded by generation ``k`` is searched with queries of the serving generation ``t``
only when the lineage shows that this is better than what ``k`` alone gave: the empirical
compatibility criterion (stationary_dsimplex.md §2, λ-orthogonality eq. 11, HBCT §11)

    M(Φ_t^Q, Φ_k^G) > M(Φ_k^Q, Φ_k^G)

with the values the pipeline's ``evaluate:`` steps recorded (``LineageStore.record_compatibility``)
on one dataset and one metric. A shard of the serving generation itself is always admitted.

Refusals (``Verdict.reason``):
- no value recorded for (t, k) or for (k, k) on that dataset and metric ("not evaluated");
- the pair was evaluated but has no common distance (value NULL in the lineage);
- the criterion fails (the cross value is not above the old self value; a tie fails, as in
  ``metrics.empirically_compatible``).

Decision: the metric defaults to ``map`` (search serves rankings; mAP scores the whole ranking)
and is configurable; the dataset is the pipeline's evaluation split.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.lineage.records import CompatibilityRecord
from orchestrator.metrics import METRICS, empirically_compatible


@dataclass(frozen=True)
class Verdict:
    """Whether ``serving`` may search ``gallery``'s embeddings; ``reason`` says why (or why not)."""

    serving: str
    gallery: str
    admitted: bool
    reason: str


@dataclass(frozen=True)
class CompatibilityCriterion:
    """The recorded compatibility values of one dataset and one metric, and the rule over them.

    values: (query generation, gallery generation) → recorded value (None: no common distance).
    """

    metric: str
    dataset: str
    values: dict[tuple[str, str], float | None]

    @classmethod
    def from_records(cls, records: Iterable[CompatibilityRecord], metric: str = "map",
                     dataset: str | None = None) -> "CompatibilityCriterion":
        """Select one dataset's values of ``metric``. ``dataset`` None: the only dataset recorded
        (ValueError naming them when there are several)."""
        if metric not in METRICS:
            raise ValueError(f"criterion metric must be one of {', '.join(METRICS)}, got {metric!r}")
        records = list(records)
        if dataset is None:
            datasets = sorted({r.dataset for r in records})
            if len(datasets) > 1:
                raise ValueError(f"the lineage holds compatibility values of several datasets {datasets}; "
                                 "name the one the criterion uses")
            dataset = datasets[0] if datasets else "(none recorded)"
        values = {(r.query, r.gallery): r.value for r in records if r.dataset == dataset and r.metric == metric}
        return cls(metric, dataset, values)

    def verdict(self, serving: str, gallery: str) -> Verdict:
        """Admit ``gallery``'s shards for ``serving``'s queries, or say why not."""
        if serving == gallery:
            return Verdict(serving, gallery, True, "same generation")
        where = f"{self.metric} on {self.dataset!r}"
        missing = [pair for pair in ((serving, gallery), (gallery, gallery)) if pair not in self.values]
        if missing:
            pairs = ", ".join(f"{q} → {g}" for q, g in missing)
            return Verdict(serving, gallery, False, f"no compatibility recorded ({where}) for {pairs}")
        cross, old_self = self.values[(serving, gallery)], self.values[(gallery, gallery)]
        if cross is None or old_self is None:
            return Verdict(serving, gallery, False, f"evaluated with no common distance ({where})")
        compared = f"M({serving} → {gallery}) = {cross:.4f} vs M({gallery} → {gallery}) = {old_self:.4f} ({where})"
        if not empirically_compatible(cross, old_self):
            return Verdict(serving, gallery, False, f"below the compatibility criterion: {compared}")
        return Verdict(serving, gallery, True, f"compatible: {compared}")
