"""Backfilling: the policy rules (``policy``), the exact selection of the top items in bounded memory
(``selection``) and the orders (``orders``, a registry) that decide which gallery items / shards a
new generation re-embeds, and tracing retrieval quality versus the fraction re-embedded (``curve``).

No Ray here: pure numpy / torch functions that the pipeline calls from wherever it runs.
"""
from orchestrator.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "curve": ["DEFAULT_FRACTIONS", "backfill_curve", "mixed_gallery", "write_backfill_curve"],
    "random_order": ["random_priority"],
    "compatibility_order": ["compatibility_ranks", "least_compatible_priority"],
    "orders": ["ORDERS", "BackfillOrder", "get_order", "register_order"],
    "policy": ["ShardPriority", "budget_count", "curve_order", "select_items", "whole_shards"],
})
