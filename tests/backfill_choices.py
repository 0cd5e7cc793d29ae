"""The backfill policy rules as the pipeline's planner applies them (``pipeline.gallery.planner``:
``backfill.policy`` over the exact selection of ``backfill.selection``), run on shards held in this
process; and the written-out reference they must agree with (one full sort)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from orchestrator.backfill.policy import Policy, ShardPriority, select_items, whole_shards
from orchestrator.backfill.selection import ScoredShard, in_memory_ask

Parts = Sequence[tuple[np.ndarray, np.ndarray]]
"""Shard ``k``'s (ids (n,), priorities (n,)), higher priority first."""


def scored_shards(parts: Parts) -> list[ScoredShard]:
    return [ScoredShard.from_scores(k, np.asarray(ids), np.asarray(scores, dtype=np.float64))
            for k, (ids, scores) in enumerate(parts)]


def summaries(parts: Parts) -> list[ShardPriority]:
    """Each shard's item count and mean priority, as the scoring tasks report them."""
    return [ShardPriority(k, len(ids), float(np.mean(scores)) if len(ids) else -np.inf)
            for k, (ids, scores) in enumerate(parts)]


def chosen_items(policy: Policy, parts: Parts) -> dict[int, list[int]]:
    """Shard → sorted ids a ``partial`` items policy re-embeds there, shards in the order of their
    first pick (dict order)."""
    shards = scored_shards(parts)
    selection = select_items(policy, in_memory_ask(shards), sum(len(ids) for ids, _ in parts))
    if selection.threshold is None:
        return {}
    return {shards[k].index: shards[k].chosen(selection.threshold).tolist() for k in selection.shards_in_order}


def whole_shard_order(policy: Policy, parts: Parts) -> tuple[int, ...]:
    """The shards a ``full`` policy or a ``partial`` one counting shards re-embeds, in order."""
    return tuple(s.index for s in whole_shards(policy, summaries(parts)))


def top_items(parts: Parts, k: int) -> dict[int, list[int]]:
    """Written out: one full sort of the gallery, priority descending, ties by id ascending; the
    first ``k`` grouped by shard (sorted ids), shards in the order of their first item."""
    ids = np.concatenate([np.asarray(i, dtype=np.int64) for i, _ in parts] or [np.zeros(0, np.int64)])
    scores = np.concatenate([np.asarray(s, dtype=np.float64) for _, s in parts] or [np.zeros(0)])
    shard_of = np.concatenate([np.full(len(i), k) for k, (i, _) in enumerate(parts)] or [np.zeros(0, int)])
    top = np.lexsort((ids, -scores))[:k]
    return {int(s): np.sort(ids[top][shard_of[top] == s]).tolist() for s in dict.fromkeys(shard_of[top].tolist())}
