"""Plain, frozen snapshots of lineage rows.

The store returns these instead of live ORM objects, so callers never hold a session, never
trigger lazy loads, and can pass records across processes (Ray tasks) or dump them as JSON.
Foreign keys are resolved to names (a generation's parent, a shard's generation).
"""
from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Optional


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


class _Record:
    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict: datetimes as ISO-8601 strings (UTC offset included)."""
        return {f.name: _json_value(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class RunRecord(_Record):
    pipeline: str
    config_sha256: str
    invocations: int
    created_at: datetime
    last_started_at: datetime


@dataclasses.dataclass(frozen=True)
class GenerationRecord(_Record):
    id: int
    name: str
    parent: Optional[str]
    method: Optional[str]
    params: dict[str, Any]
    arch: Optional[str]
    space: Optional[str]
    curv: Optional[float]
    checkpoint_uri: Optional[str]
    sha256: Optional[str]
    status: str
    metrics: dict[str, Any]
    created_at: datetime
    updated_at: datetime


@dataclasses.dataclass(frozen=True)
class GalleryRecord(_Record):
    name: str
    source_uri: Optional[str]
    n_items: Optional[int]
    n_shards: int


@dataclasses.dataclass(frozen=True)
class ShardRecord(_Record):
    gallery: str
    index: int
    n_items: Optional[int]
    generation: Optional[str]
    embeddings_uri: Optional[str]
    index_uri: Optional[str]
    sha256: Optional[str]
    updated_at: datetime


@dataclasses.dataclass(frozen=True)
class ShardAssignment:
    """One shard's new content, for ``LineageStore.assign_shards``.

    backfilled_from: the generation whose items this shard now holds re-embedded, when that is
                     not the shard's own previous generation (a shard created by moving backfilled
                     items out of another shard); None: the shard's previous generation.
    """

    index: int
    generation: str
    embeddings_uri: Optional[str] = None
    index_uri: Optional[str] = None
    sha256: Optional[str] = None
    n_items: Optional[int] = None
    backfilled_from: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class BackfillRecord(_Record):
    id: int
    gallery: str
    shard_index: int
    from_generation: Optional[str]
    to_generation: str
    items: Optional[int]
    status: str
    started_at: datetime
    finished_at: Optional[datetime]


@dataclasses.dataclass(frozen=True)
class CompatibilityRecord(_Record):
    query: str
    gallery: str
    metric: str
    value: Optional[float]  # None: evaluated, but the pair has no common distance (NaN in reports)
    dataset: str


@dataclasses.dataclass(frozen=True)
class DeploymentRecord(_Record):
    id: int
    generation: str
    started_at: datetime


@dataclasses.dataclass(frozen=True)
class StepRecord(_Record):
    key: str
    status: str
    attempts: int
    outputs: dict[str, Any]
    error: Optional[str]
    started_at: datetime
    finished_at: Optional[datetime]


@dataclasses.dataclass(frozen=True)
class CandidateRecord(_Record):
    """A sweep trial's generation (``name``), never deployed; see ``LineageStore.record_candidate``."""

    name: str
    parent: Optional[str]
    sweep: str
    trial_id: str
    outcome: str
    epochs: int
    objective: Optional[float]
    created_at: datetime
    updated_at: datetime
