"""A generation's gallery plan: which shards it embeds or backfills, frozen before any work starts.

The plan is computed once per (gallery, generation) from the gallery as it is then, written as a
JSON file, and its step (``plan:<gallery>:<generation>``) commits pointing at that file. The
work steps that follow execute its entries; a re-run after a crash reads the committed plan
instead of planning again, because planning again on a half-backfilled gallery would pick
different (more) items and overrun the budget.

Entries (``shard_update.ShardUpdate``; sized for galleries of any size: a range or a file, never a
list of items):
- ``embed``: (re-)embed every item of ``shard``: its gallery ``rows`` [start, stop) for the first
  population, else the items of its file in ``before`` (``full``, whole shards of a ``partial``
  budget);
- ``split``: re-embed the items of ``shard`` that the ``selection`` file (URI, sha256) lists and
  move them to the new shard ``target`` (``partial`` with budget_unit ``items``: a shard keeps
  holding one generation, so the backfilled items of a shard become a shard of their own; the
  source shard is rewritten without them).

The plan also records the gallery before it (``before``: each shard's generation and files) and
``order``, every item id in backfill priority order, for the backfilling curve.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from orchestrator.shard_update.update import ShardUpdate


@dataclass(frozen=True)
class ShardBefore:
    """A shard as the plan found it (generation None: never embedded)."""

    shard: int
    generation: str | None
    embeddings_uri: str | None
    sha256: str | None
    n_items: int | None


@dataclass(frozen=True)
class GalleryPlan:
    """What ``generation`` does to ``gallery`` (module docstring); JSON round-trips exactly."""

    gallery: str
    generation: str
    policy: dict[str, Any]
    entries: tuple[ShardUpdate, ...]
    before: tuple[ShardBefore, ...]
    order: tuple[int, ...] = field(default=())

    @property
    def num_items(self) -> int:
        return sum(e.num_items for e in self.entries)

    def to_json(self) -> dict[str, Any]:
        return {"gallery": self.gallery, "generation": self.generation, "policy": self.policy,
                "entries": [e.planned_json() for e in self.entries],
                "before": [asdict(b) for b in self.before], "order": list(self.order)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GalleryPlan:
        entries = tuple(ShardUpdate.from_planned_json(e) for e in data["entries"])
        before = tuple(ShardBefore(**b) for b in data["before"])
        return cls(data["gallery"], data["generation"], dict(data["policy"]), entries, before,
                   tuple(int(i) for i in data["order"]))

    def order_array(self) -> np.ndarray:
        return np.asarray(self.order, dtype=np.int64)
