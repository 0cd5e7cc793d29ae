"""Between the ORM rows and the frozen records the store returns: row lookups that raise
``LookupError`` naming what is missing, the record builders, and the value helpers (JSON-clean
values, UTC datetimes, assignments that report a change)."""
from __future__ import annotations

import math
import os
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Optional

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.lineage.records import BackfillRecord, GalleryRecord, GenerationRecord, ShardRecord, StepRecord
from orchestrator.lineage.schema import Backfill, Gallery, Generation, Shard, Step


def aware(value: Optional[datetime]) -> Optional[datetime]:
    """SQLite stores datetimes without offset; everything this store writes is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value


def clean_json(value: Any) -> Any:
    """``value`` as plain JSON data: non-finite floats → None (PostgreSQL's JSON rejects NaN),
    tuples/sets → lists, numpy/torch scalars and arrays → Python values, paths → strings."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(clean_json(v) for v in value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "tolist"):  # numpy / torch scalars and arrays
        return clean_json(value.tolist())
    raise TypeError(f"lineage: {type(value).__name__} value is not JSON-serialisable: {value!r}")


def float_or_none(value: Any) -> Optional[float]:
    """A finite float, or None (None, NaN, ±inf)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def assign(obj: Any, **fields: Any) -> bool:
    """Set only the fields that differ; True when anything changed."""
    changed = False
    for name, value in fields.items():
        if getattr(obj, name) != value:
            setattr(obj, name, value)
            changed = True
    return changed


def missing(kind: str, names: Iterable[str]) -> LookupError:
    """LookupError naming the unknown ``kind`` names."""
    names = sorted(set(names))
    return LookupError(f"unknown {kind}{'s' if len(names) > 1 else ''}: {', '.join(names)}")


def find_generation(session: Session, name: str, *, lock: bool = False) -> Generation:
    """The row of generation ``name`` (optionally locked for update); LookupError if unknown."""
    stmt = select(Generation).where(Generation.name == name)
    row = session.scalars(stmt.with_for_update() if lock else stmt).one_or_none()
    if row is None:
        raise missing("generation", [name])
    return row


def find_generations(session: Session, names: Iterable[str]) -> dict[str, Generation]:
    """The rows of ``names`` by name; LookupError naming the unknown ones."""
    names = set(names)
    rows = session.scalars(select(Generation).where(Generation.name.in_(names))).all() if names else []
    found = {row.name: row for row in rows}
    if names - set(found):
        raise missing("generation", names - set(found))
    return found


def find_gallery(session: Session, name: str) -> Gallery:
    """The row of gallery ``name``; LookupError if unknown."""
    row = session.scalars(select(Gallery).where(Gallery.name == name)).one_or_none()
    if row is None:
        raise missing("gallery", [name])
    return row


def generation_names(session: Session) -> dict[int, str]:
    """{generation id: name} of every generation."""
    return dict(session.execute(select(Generation.id, Generation.name)).all())


def generation_record(row: Generation, names: Mapping[int, str]) -> GenerationRecord:
    """The record of a generation row (``names`` resolves its parent)."""
    return GenerationRecord(
        id=row.id, name=row.name, parent=names.get(row.parent_id) if row.parent_id else None,
        method=row.method, params=dict(row.params or {}), arch=row.arch, space=row.space,
        curv=row.curv, checkpoint_uri=row.checkpoint_uri, sha256=row.sha256, status=row.status,
        metrics=dict(row.metrics or {}), created_at=aware(row.created_at),
        updated_at=aware(row.updated_at),
    )


def step_record(row: Step) -> StepRecord:
    """The record of a step row."""
    return StepRecord(
        key=row.key, status=row.status, attempts=row.attempts, outputs=dict(row.outputs or {}),
        error=row.error, started_at=aware(row.started_at), finished_at=aware(row.finished_at),
    )


def shard_record(row: Shard, gallery: str, names: Mapping[int, str]) -> ShardRecord:
    """The record of a shard row of ``gallery``."""
    return ShardRecord(
        gallery=gallery, index=row.index, n_items=row.n_items,
        generation=names.get(row.generation_id) if row.generation_id else None,
        embeddings_uri=row.embeddings_uri, index_uri=row.index_uri, sha256=row.sha256,
        updated_at=aware(row.updated_at),
    )


def backfill_record(row: Backfill, gallery: str, shard_index: int, names: Mapping[int, str]) -> BackfillRecord:
    """The record of a backfill row of a shard of ``gallery``."""
    return BackfillRecord(
        id=row.id, gallery=gallery, shard_index=shard_index,
        from_generation=names.get(row.from_generation_id) if row.from_generation_id else None,
        to_generation=names[row.to_generation_id], items=row.items, status=row.status,
        started_at=aware(row.started_at), finished_at=aware(row.finished_at),
    )


def gallery_record(row: Gallery) -> GalleryRecord:
    """The record of a gallery row."""
    return GalleryRecord(name=row.name, source_uri=row.source_uri, n_items=row.n_items, n_shards=row.n_shards)
