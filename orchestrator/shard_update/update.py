"""One shard update, as the plan freezes it, a worker runs it and the driver commits it.

A generation's gallery plan (``pipeline.gallery.plan``) is a list of ``ShardUpdate``: what each
update does to which shard. When its lineage step starts, the executor adds what a run of it needs
(``started``): its step key, whether this is the step's first attempt and the stored file its items
are read from; the same object then travels to the workers (``distributed.gallery_step``), tells
the read tasks what to read (``distributed.gallery_read``), and is what the driver commits. Plain
data (a few hundred bytes, never items); nothing here imports Ray, pyarrow or the lineage store.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from orchestrator.lineage.step_keys import StepKind, shard_update_key


class UpdateKind(str, enum.Enum):
    """What an update does to its shard (the value: its step key's kind and the plan file's ``kind``)."""

    EMBED = "embed"  # the shard's items, all (re-)embedded into the shard itself
    SPLIT = "split"  # the items a selection names move, re-embedded, to a new shard ``target``


@dataclass(frozen=True)
class ShardUpdate:
    """One shard update.

    As planned (what the plan file holds):
    kind:          ``UpdateKind``;
    shard:         the shard it updates (a split: the shard its items leave);
    num_items:     the items planned;
    rows:          the gallery rows [start, stop) of a first population (None: the items are those
                   of the shard's stored file, ``source``);
    selection:     a split's selection file (URI, sha256) naming the ids that move;
    target:        a split's new shard.

    As started (``started``; the defaults until then):
    key:           its lineage step (``embed:<gallery>/<shard>:<gen>`` / ``split:…``, ``step_key``);
    first_attempt: whether the step is on its first attempt (then no existing file is overwritten);
    source:        the stored shard file (URI, sha256) its items are read from (None: ``rows``).
    """

    kind: UpdateKind
    shard: int
    num_items: int
    rows: tuple[int, int] | None = None
    selection: tuple[str, str] | None = None
    target: int | None = None
    key: str = ""
    first_attempt: bool = True
    source: tuple[str, str] | None = None

    def step_key(self, gallery: str, generation: str) -> str:
        return shard_update_key(StepKind(self.kind.value), gallery, self.shard, generation)

    def started(self, key: str, first_attempt: bool, source: tuple[str, str] | None) -> ShardUpdate:
        """This update as a run of its step ``key`` carries it to the workers."""
        return dataclasses.replace(self, key=key, first_attempt=first_attempt, source=source)

    def planned_json(self) -> dict[str, Any]:
        """What the plan file holds of this update."""
        return {"kind": self.kind.value, "shard": self.shard, "num_items": self.num_items,
                "rows": None if self.rows is None else list(self.rows),
                "selection": None if self.selection is None else list(self.selection), "target": self.target}

    @classmethod
    def from_planned_json(cls, data: dict[str, Any]) -> ShardUpdate:
        """The update a plan file's entry describes (``planned_json``'s inverse)."""
        rows, selection = data.get("rows"), data.get("selection")
        return cls(UpdateKind(data["kind"]), int(data["shard"]), int(data["num_items"]),
                   None if rows is None else (int(rows[0]), int(rows[1])),
                   None if selection is None else (str(selection[0]), str(selection[1])), data.get("target"))
