"""The backfill policy rules, once: which shards or how many items a policy re-embeds, and in what
order, from per-shard priority summaries and the exact item selection (``backfill.selection``).

The pipeline's planner (``pipeline.gallery.planner``) applies them to shards scored on Ray
(``distributed.backfill_scores``); tests apply them to shards held in the process
(``selection.in_memory_ask``). Priorities: higher = re-embed earlier (``backfill.orders``).

Rounding decision: the budget is a cap on cost, so a plan never exceeds it: a partial budget β
re-embeds ``⌊β·N⌋`` of the N items (budget_unit ``items``) or ``⌊β·S⌋`` of the S shards
(``shards``), the same ``⌊β·N⌋`` as the backfilling curve Φ^G_{π,β} (λ-orth §2.11). A product that
is an integer up to floating-point error (``0.29 · 100``) counts as that integer. A budget below
one unit gives an empty plan.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from orchestrator.backfill.selection import Ask, select_top


class Policy(Protocol):
    """The fields of ``config.BackfillPolicy`` the rules read."""

    policy: str
    budget: float | None
    budget_unit: str
    order: str


@dataclass(frozen=True)
class ShardPriority:
    """A candidate shard as the rules see it: its index, item count and mean priority (−inf when empty)."""

    index: int
    n: int
    mean: float


def budget_count(budget: float, total: int) -> int:
    """``⌊budget · total⌋``, counting a product within 1e-9 (relative) of an integer as that integer."""
    x = float(budget) * int(total)
    nearest = round(x)
    if abs(x - nearest) <= 1e-9 * max(1.0, abs(x)):
        return int(nearest)
    return int(math.floor(x))


def ranked_shards(shards: Sequence[ShardPriority]) -> list[ShardPriority]:
    """Shards by descending mean priority, ties (and empty shards, mean −inf) by ascending index."""
    return sorted(shards, key=lambda s: (-s.mean, s.index))


def whole_shards(policy: Policy, shards: Sequence[ShardPriority]) -> list[ShardPriority]:
    """What a ``full`` policy or a ``partial`` one counting ``shards`` re-embeds: every shard, or
    the ``⌊budget·S⌋`` of highest mean priority, in that order; empty shards left out."""
    ranked = ranked_shards(shards)
    if policy.policy == "partial":
        ranked = ranked[:budget_count(policy.budget, len(shards))]
    return [s for s in ranked if s.n]


def reembeds_whole_shards(policy: Policy) -> bool:
    """Whether ``policy`` re-embeds shards whole (``full``, or ``partial`` counting shards)."""
    return policy.policy == "full" or policy.budget_unit == "shards"


@dataclass(frozen=True)
class ItemSelection:
    """The top ``⌊budget·N⌋`` items of the gallery-wide order: every candidate's items whose key is
    at most ``threshold`` (``ScoredShard.chosen``), and the candidates (positions) that give any, in
    the order of their first pick."""

    threshold: tuple[int, int] | None
    shards_in_order: tuple[int, ...]


def select_items(policy: Policy, ask: Ask, total: int) -> ItemSelection:
    """A ``partial`` policy counting items, over candidates that ``ask`` questions (exact, in
    bounded memory: ``selection.select_top``)."""
    threshold, best = select_top(ask, budget_count(policy.budget, total), total)
    picks = sorted((key, position) for position, key in enumerate(best) if key is not None)
    return ItemSelection(threshold, tuple(position for _key, position in picks))


def curve_order(policy: Policy, shards: Sequence[ShardPriority], keys: Sequence[np.ndarray]) -> np.ndarray:
    """Every candidate id in the order the policy backfills (the backfilling curve's x-axis):
    whole shards by mean priority when a partial policy counts shards, else one gallery-wide
    ranking. ``keys``: per candidate (in ``shards``' order), (n, 3) uint64 rows of the item's two
    key words (``selection.priority_keys``) and its id."""
    if policy.policy == "partial" and policy.budget_unit == "shards":
        position = {s.index: k for k, s in enumerate(shards)}
        parts = [keys[position[s.index]] for s in ranked_shards(shards)]
        return np.concatenate([p[np.lexsort((p[:, 1], p[:, 0])), 2] for p in parts]).view(np.int64)
    every = np.concatenate(list(keys))
    return every[np.lexsort((every[:, 1], every[:, 0])), 2].view(np.int64)
