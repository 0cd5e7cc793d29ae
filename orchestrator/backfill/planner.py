"""Backfill planning: which gallery items (or whole shards) a new generation re-embeds, and in what order.

``plan_backfill`` is a pure function of a backfill policy (``config.BackfillPolicy``), the shard
layout (``ShardInfo``: item ids and per-item priority scores) and a seed. Priority scores come from
one of the order functions below; a HIGHER score means "re-embed earlier":

- ``uncertainty_priority``: hyperbolic uncertainty of the old Lorentz embedding (HBCT §5, §14);
- ``class_mean_distance_priority``: distance to the class mean in the forward-transformed space
  (λ-orthogonality §2.11; the one implementation is ``metrics.class_means``);
- ``random_priority``: a seeded per-item pseudo-random number (FCT / FastFill's random baseline).

FastFill's own order is NOT provided. FastFill (Jaeckle et al. 2023) orders by the uncertainty that
its forward model predicts for each item (a Gaussian NLL head trained jointly with F); none of the
methods here trains such a head, and the alignment error ‖F(h_old) − h_new‖ is known only for items
whose new embedding has already been computed, i.e. exactly the items that no longer need a
backfill. Any substitute (e.g. regressing probe-set errors onto the gallery) would be our own
method under FastFill's name, so it is left out (the config's ``order`` does not offer it either).

The policy rules themselves (which shards, how many items, in what order) live once in
``backfill.policy``; ``plan_backfill`` applies them to shards held in memory, the pipeline to
shards scored on Ray.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from orchestrator.backfill.policy import (Policy, ShardPriority, budget_count, reembeds_whole_shards, select_items,
                                          whole_shards)
from orchestrator.backfill.random_order import random_priority
from orchestrator.backfill.selection import ScoredShard, in_memory_ask
from orchestrator.geometry import lorentz
from orchestrator.methods.common import class_mean_distances

__all__ = [
    "BackfillPlan",
    "ShardBackfill",
    "ShardInfo",
    "budget_count",
    "class_mean_distance_priority",
    "plan_backfill",
    "priority_order",
    "random_priority",
    "uncertainty_priority",
]


# --------------------------------------------------------------------------------------------
# data types


@dataclass(frozen=True)
class ShardInfo:
    """One gallery shard as the planner sees it.

    index:    the shard's index (unique within a plan).
    item_ids: (n,) integer item ids (unique across all shards).
    scores:   (n,) finite priorities aligned with ``item_ids`` (higher = re-embed earlier), or None
              (allowed for order ``random``, which derives them from the seed, and policy ``none``).
              Scores must be computed on the WHOLE gallery and then split by shard: the class means
              of ``class_mean_distance_priority`` are gallery-wide.
    """

    index: int
    item_ids: np.ndarray
    scores: np.ndarray | None = None


@dataclass(frozen=True)
class ShardBackfill:
    """What to re-embed in one shard: ``item_ids`` (k,) in priority order; ``whole`` when the shard
    is re-embedded completely (every item)."""

    index: int
    item_ids: np.ndarray
    whole: bool


@dataclass(frozen=True)
class BackfillPlan:
    """The outcome of ``plan_backfill``.

    shards: the shards with something to re-embed, in the order they should be processed (budget
            unit ``shards`` and policy ``full``: by descending mean priority; ``items``: by the
            priority of each shard's first item). Shards with nothing to re-embed are omitted.
    total_items / total_shards: the gallery's size, for reporting the fraction re-embedded.
    """

    policy: str
    order: str
    budget_unit: str
    budget: float | None
    shards: tuple[ShardBackfill, ...]
    total_items: int
    total_shards: int

    @property
    def num_items(self) -> int:
        return int(sum(s.item_ids.size for s in self.shards))

    @property
    def shard_indices(self) -> tuple[int, ...]:
        return tuple(s.index for s in self.shards)

    @property
    def item_ids(self) -> np.ndarray:
        """(num_items,) every item id to re-embed, concatenated in plan order."""
        if not self.shards:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([s.item_ids for s in self.shards])

    @property
    def fraction(self) -> float:
        """Fraction of the gallery's items re-embedded (0 for an empty gallery)."""
        return self.num_items / self.total_items if self.total_items else 0.0


# --------------------------------------------------------------------------------------------
# order functions (higher score = earlier)


def uncertainty_priority(old_embeddings: torch.Tensor | np.ndarray, curv: float | torch.Tensor) -> np.ndarray:
    """HBCT hyperbolic uncertainty of the OLD gallery embeddings as priority (HBCT §5 eq. 10, §14).

    Shapes: ``old_embeddings`` (N, d+1) points on the Lorentz hyperboloid (time first), positive
    curvature magnitude ``curv`` -> (N,) float64 in [0, 1] (``geometry.lorentz.uncertainty``).

    Decision: HIGHER uncertainty first. HBCT §14 reports that embeddings the old model is unsure
    of (classes it never saw) have higher uncertainty / lower norm, and that uncertainty drops
    when the model improves; these are the items whose old embedding is least trustworthy, so
    re-embedding them first buys the largest gain per item (the same rationale as FastFill's
    "most uncertain first", which HBCT says "can be integrated"). Lower-norm points come first.
    """
    x = torch.as_tensor(old_embeddings)
    if x.dim() != 2 or x.shape[1] < 2:
        raise ValueError(f"old_embeddings must be (N, d+1) Lorentz points, got {tuple(x.shape)}")
    if not x.is_floating_point():
        x = x.double()
    with torch.no_grad():
        u = lorentz.uncertainty(x, curv)
    return u.detach().cpu().double().numpy()


def class_mean_distance_priority(
    forward_embeddings: torch.Tensor | np.ndarray,
    labels: torch.Tensor | np.ndarray,
    distance: Literal["l2", "cosine"] = "l2",
) -> np.ndarray:
    """λ-orthogonality order (§2.11): distance of each item to its class mean, farthest first.

    Shapes: ``forward_embeddings`` (N, n) the forward-transformed old gallery F(h_k) (use
    ``model.adapters[FORWARD_ADAPTER](h_old)``, the slot of ``orchestrator.models.adapters``; for a
    method without a forward map, the old gallery itself), ``labels`` (N,) class ids -> (N,) float64 distances
    (``l2``: ‖F(h_i) − μ_{y_i}‖₂, ``cosine``: 1 − cos). Items least representative of their class
    are backfilled first. Delegates to ``metrics.class_means`` through ``methods.common.class_mean_distances`` (one implementation,
    also behind ``lambda_orth.backfill_order``).
    """
    f = torch.as_tensor(forward_embeddings)
    if not f.is_floating_point():
        f = f.double()
    y = torch.as_tensor(labels).to(device=f.device)
    with torch.no_grad():
        gap = class_mean_distances(f, y, distance)
    return gap.detach().cpu().double().numpy()


def priority_order(scores: np.ndarray, item_ids: np.ndarray) -> np.ndarray:
    """Indices (N,) sorting by DESCENDING score; ties by ascending item id (deterministic)."""
    scores = np.asarray(scores, dtype=np.float64)
    item_ids = np.asarray(item_ids)
    return np.lexsort((item_ids, -scores))


# --------------------------------------------------------------------------------------------
# planner


def _checked_shards(shards: list[ShardInfo], need_scores: bool, order: str, seed: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
    seen_index: set[int] = set()
    out = []
    for shard in shards:
        if shard.index in seen_index:
            raise ValueError(f"duplicate shard index {shard.index}")
        seen_index.add(shard.index)
        ids = np.asarray(shard.item_ids)
        if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"shard {shard.index}: item_ids must be a 1-D integer array, got {ids.shape} {ids.dtype}")
        ids = ids.astype(np.int64)
        if shard.scores is None:
            if need_scores and order != "random":
                raise ValueError(f"shard {shard.index}: order {order!r} needs per-item scores, got None")
            scores = random_priority(ids, seed) if order == "random" else np.zeros(ids.size)
        else:
            scores = np.asarray(shard.scores, dtype=np.float64)
            if scores.shape != ids.shape:
                raise ValueError(f"shard {shard.index}: scores must have shape {ids.shape}, got {scores.shape}")
            if not np.isfinite(scores).all():
                raise ValueError(f"shard {shard.index}: scores must be finite")
        out.append((int(shard.index), ids, scores))
    all_ids = np.concatenate([ids for _, ids, _ in out]) if out else np.zeros(0, dtype=np.int64)
    if np.unique(all_ids).size != all_ids.size:
        raise ValueError("item ids must be unique across shards")
    return out


def plan_backfill(policy: Policy, shards: list[ShardInfo], seed: int = 0) -> BackfillPlan:
    """Plan the backfill of a sharded gallery under ``policy`` (pure; see the module docstring).

    - ``none``: the empty plan (the new generation searches old shards through compatibility).
    - ``full``: every item of every shard, shards by descending mean priority, items within a
      shard by descending priority.
    - ``partial`` + ``items``: the ``⌊budget·N⌋`` highest-priority items of the whole gallery
      (gallery-wide ranking, ties by item id), grouped by shard.
    - ``partial`` + ``shards``: the ``⌊budget·S⌋`` shards with the highest mean priority (ties by
      shard index), each re-embedded whole.

    Args:
        policy: the generation's ``config.BackfillPolicy`` (or anything with its four fields).
        shards: the gallery's shards with per-item priority scores (see ``ShardInfo``).
        seed: for order ``random`` when scores are None (``random_priority``).
    """
    checked = _checked_shards(list(shards), need_scores=policy.policy != "none", order=policy.order, seed=seed)
    scored = [ScoredShard.from_scores(index, ids, scores) for index, ids, scores in checked]
    summaries = [ShardPriority(index, ids.size, float(scores.mean()) if ids.size else -np.inf)
                 for index, ids, scores in checked]
    total_items = int(sum(ids.size for _, ids, _ in checked))

    def make(selected: tuple[ShardBackfill, ...]) -> BackfillPlan:
        return BackfillPlan(policy.policy, policy.order, policy.budget_unit, policy.budget, selected, total_items,
                            len(checked))

    if policy.policy == "none":
        return make(())
    if reembeds_whole_shards(policy):
        position = {s.index: k for k, s in enumerate(scored)}
        return make(tuple(ShardBackfill(s.index, _in_key_order(scored[position[s.index]]), whole=True)
                          for s in whole_shards(policy, summaries)))
    selection = select_items(policy, in_memory_ask(scored), total_items)
    if selection.threshold is None:
        return make(())
    chosen = [_in_key_order(scored[k], selection.threshold) for k in selection.shards_in_order]
    return make(tuple(ShardBackfill(scored[k].index, ids, whole=ids.size == scored[k].ids.size)
                      for k, ids in zip(selection.shards_in_order, chosen)))


def _in_key_order(shard: ScoredShard, threshold: tuple[int, int] | None = None) -> np.ndarray:
    """The shard's ids in priority order (key order), only those at most ``threshold`` when given."""
    order = np.lexsort((shard.low, shard.high))
    if threshold is not None:
        high, low = np.uint64(threshold[0]), np.uint64(threshold[1])
        keep = (shard.high < high) | ((shard.high == high) & (shard.low <= low))
        order = order[keep[order]]
    return shard.ids[order]
