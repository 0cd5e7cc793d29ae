"""The training-time quality warning (issue 14): a generation whose own retrieval falls far below
what the same training reaches without compatibility (the unaligned reference φ_*) is named.

P_up (hbct.md eq. 15 as the HBCT tables compute it, ``metrics.reported_p_up``):
``(M(φ_n; φ_n) − M(φ_*; φ_*)) / M(φ_*; φ_*)`` on mAP; below ``evaluation.warn_p_up`` the alignment
costs the new model that share of the quality it could have had, which the criterion alone (cross
against the old self-test) never shows.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from orchestrator.lineage.records import CompatibilityRecord
from orchestrator.metrics import reported_p_up

WARNING_METRIC = "map"


def self_tests(values: Iterable[CompatibilityRecord], metric: str = WARNING_METRIC) -> dict[str, float]:
    """Generation → its recorded self-test M(φ; φ) on ``metric`` (undefined values left out)."""
    return {v.query: v.value for v in values if v.query == v.gallery and v.metric == metric and v.value is not None}


def reference_p_up(selfs: Mapping[str, float], name: str, reference: str | None) -> float | None:
    """P_up of generation ``name`` against ``reference`` from the self-tests, as the report prints
    it (``metrics.reported_p_up``: the weak-reference rule); None without a reference, either
    self-test, or where the report prints n/a."""
    if reference is None or reference not in selfs or name not in selfs:
        return None
    value = reported_p_up(selfs[name], selfs[reference])
    return None if math.isnan(value) else value


def own_quality_warnings(selfs: Mapping[str, float], generations: Mapping[str, str | None], reference: str | None,
                         floor: float | None) -> dict[str, str]:
    """Generation → warning line for every generation with a parent (``generations``: name → parent)
    whose P_up against ``reference`` (``reference_p_up``) is below ``floor``; {} without a floor."""
    if floor is None:
        return {}
    warnings = {}
    for name, parent in generations.items():
        gain = None if parent is None or name == reference else reference_p_up(selfs, name, reference)
        if gain is not None and gain < floor:
            warnings[name] = (f"warning: {name}'s own mAP {selfs[name]:.4f} is far below the unaligned reference "
                              f"{reference}'s {selfs[reference]:.4f} (P_up {gain:+.3f} < evaluation.warn_p_up "
                              f"{floor:g}): its compatibility training costs it that share of its quality")
    return warnings
