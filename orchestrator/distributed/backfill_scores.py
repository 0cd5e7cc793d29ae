"""Ray tasks of the backfill planner: per-shard priorities computed where the shard files are read,
kept in the object store, and questioned by the exact selection of ``orchestrator.backfill.selection``.

The driver never holds the gallery's embeddings or scores: each task reads one shard file
(sha256 checked), computes its items' priorities for the policy's order and returns a small
summary (items, mean priority) plus a reference to its ``ScoredShard``, which stays in the object
store for the selection rounds. Class-mean distances take two passes: per-shard class sums, then
distances to the gallery-wide means. No science here: the priority functions are the planner's.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.backfill.orders import OrderInputs, get_order, shard_priorities
from orchestrator.backfill.selection import Ask, ScoredShard
from orchestrator.gallery.shard_files import read_shard, write_selection
from orchestrator.metrics.class_means import class_sums, combine_class_sums


@dataclass(frozen=True)
class ShardToScore:
    """A candidate shard: its index and stored file."""

    index: int
    uri: str
    sha256: str


@dataclass(frozen=True)
class PriorityRule:
    """How priorities are computed: ``order`` (uncertainty | class_mean_distance | random |
    least_compatible), the seed of ``random`` and ``least_compatible``, for class means the model
    whose forward map applies to ``mapped_generation``'s shards (checkpoint URI and sha256) — None
    when there is none — and for least_compatible each stored generation's rank
    (``compatibility_ranks``)."""

    order: str
    seed: int
    where: str
    forward_model: tuple[str, str] | None = None
    mapped_generation: str | None = None
    generation_ranks: Mapping[str, int] | None = None


def _features(rule: PriorityRule, shard) -> np.ndarray:
    """(n, D) float64 features of a shard for class-mean distances: F(h_old) for the mapped
    generation's shards when the new model has a forward map, the embeddings otherwise. Only the
    forward map needs torch and the model: tasks of the other orders start without importing them."""
    if rule.forward_model is None or shard.generation != rule.mapped_generation:
        return shard.embeddings.astype(np.float64)
    import torch

    from orchestrator.methods.loading import load_generation
    from orchestrator.models.adapters import FORWARD_ADAPTER

    model, _card = load_generation(rule.forward_model[0], expected_sha256=rule.forward_model[1])
    with torch.no_grad():
        return model.adapters[FORWARD_ADAPTER].double()(torch.from_numpy(shard.embeddings.astype(np.float64))).numpy()


def _read_labelled(rule: PriorityRule, target: ShardToScore):
    shard = read_shard(target.uri, expected_sha256=target.sha256)
    if (shard.labels < 0).any():
        raise ValueError(f"{rule.where}: needs gallery labels; shard {target.index} has items without a label")
    return shard


def _class_sums(rule: PriorityRule, target: ShardToScore) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    shard = _read_labelled(rule, target)
    return class_sums(_features(rule, shard), shard.labels)


def _score(rule: PriorityRule, target: ShardToScore, means: dict[int, np.ndarray] | None) -> tuple[dict[str, Any], ScoredShard]:
    shard = read_shard(target.uri, expected_sha256=target.sha256)
    order = get_order(rule.order)
    features = _features(rule, shard) if order.needs_class_means else None
    inputs = OrderInputs(rule.where, rule.seed, rule.generation_ranks, means, features)
    scores = shard_priorities(shard, rule.order, inputs, target.index)
    summary = {"index": target.index, "n": int(scores.size), "mean": float(scores.mean()) if scores.size else -np.inf}
    return summary, ScoredShard.from_scores(target.index, shard.ids, scores)


def _call(shard: ScoredShard, method: str, args: tuple) -> Any:
    return getattr(shard, method)(*args)


def _write_chosen(shard: ScoredShard, threshold: tuple[int, int], uri: str) -> tuple[int, str | None]:
    chosen = shard.chosen(threshold)
    if chosen.size in (0, shard.ids.size):  # nothing, or the whole shard: no selection file needed
        return int(chosen.size), None
    return int(chosen.size), write_selection(uri, chosen)


class ScoredGallery:
    """The candidate shards scored on Ray (``score``), questioned by the selection (``ask``).

    Every task asks one CPU: each reads a shard or works on its scores. Asking none, a burst of a
    task per shard made Ray start a worker process per task (measured over the test suite: 96
    processes of about 1.1 s of CPU each, mostly imports), and a gallery of thousands of shards
    would start that many at once on a node; with a CPU each, a node runs as many as it has CPUs
    and its workers take the next tasks."""

    def __init__(self, rule: PriorityRule, targets: list[ShardToScore]):
        import ray

        self._remote = ray.remote(num_cpus=1)
        means = None
        if get_order(rule.order).needs_class_means:
            task = self._remote(_class_sums)
            means = combine_class_sums(ray.get([task.remote(rule, t) for t in targets]))
        score = self._remote(_score).options(num_returns=2)
        pairs = [score.remote(rule, t, means) for t in targets]
        self.summaries = ray.get([summary for summary, _ in pairs])
        self.refs = [ref for _, ref in pairs]

    def ask(self) -> Ask:
        import ray

        call = self._remote(_call)
        return lambda method, args: ray.get([call.remote(ref, method, args) for ref in self.refs])

    def write_chosen(self, threshold: tuple[int, int], uris: list[str]) -> list[tuple[int, str | None]]:
        import ray

        task = self._remote(_write_chosen)
        return ray.get([task.remote(ref, threshold, uri) for ref, uri in zip(self.refs, uris)])

    def all_keys(self) -> list[np.ndarray]:
        """Per shard, (n, 3) uint64: every candidate's key and id (the backfilling curve's order;
        O(N) in the driver, for evaluation-sized galleries)."""
        import ray

        return ray.get([self._remote(_keys_and_ids).remote(ref) for ref in self.refs])


def _keys_and_ids(shard: ScoredShard) -> np.ndarray:
    return np.stack([shard.high, shard.low, shard.ids.view(np.uint64)], axis=1)
