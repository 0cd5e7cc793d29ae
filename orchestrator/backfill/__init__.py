"""Backfilling: planning which gallery items / shards a new generation re-embeds (``planner``)
and tracing retrieval quality versus the fraction re-embedded (``curve``).

No Ray here: pure numpy / torch functions that the pipeline calls from wherever it runs.
"""
from orchestrator.backfill.curve import DEFAULT_FRACTIONS, backfill_curve, mixed_gallery, write_backfill_curve
from orchestrator.backfill.planner import (
    BackfillPlan,
    ShardBackfill,
    ShardInfo,
    budget_count,
    class_mean_distance_priority,
    plan_backfill,
    priority_order,
    random_priority,
    uncertainty_priority,
)

__all__ = [
    "DEFAULT_FRACTIONS",
    "BackfillPlan",
    "ShardBackfill",
    "ShardInfo",
    "backfill_curve",
    "budget_count",
    "class_mean_distance_priority",
    "mixed_gallery",
    "plan_backfill",
    "priority_order",
    "random_priority",
    "uncertainty_priority",
    "write_backfill_curve",
]
