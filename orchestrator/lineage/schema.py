"""Tables of the lineage store (SQLAlchemy 2.0 declarative models).

Portable on purpose: only Integer, String, Text, Float, DateTime(timezone=True) and JSON columns,
plain foreign keys, and named UNIQUE / CHECK constraints, so the same schema serves SQLite (the
default, one file under the storage root) and PostgreSQL. The database is created and changed by
the Alembic revisions in ``migrations/versions`` (``migrate.py``), never by ``create_all``: a
change here needs a new revision, and a test checks that the migrated schema equals these models. Idempotency comes from
the unique constraints: a generation, gallery, shard (gallery, index), compatibility value
(query, gallery, metric, dataset) or step key exists at most once, whatever re-runs do.

Datetimes are written as timezone-aware UTC. SQLite drops the offset on storage; the store's
readers put UTC back on naive values, so callers always see aware datetimes.

Tables:
    pipeline_runs   one row per (pipeline, config sha256); invocations counts re-runs
    generations     one model generation: parent, method and params, arch/space/curvature,
                    checkpoint URI + sha256, status (pending|training|trained|failed), metrics
    galleries       a gallery set: source URI, item count, shard count
    shards          one shard of a gallery (UNIQUE gallery_id, index) and the generation whose
                    embeddings/index it currently holds
    backfills       one re-embedding of a shard from one generation to another
                    (status started|committed|failed)
    compatibility   one retrieval value of (query generation, gallery generation, metric, dataset)
    deployments     which generation serves queries, append-only; the newest row is current
    steps           one pipeline step by key ("train:g1", "evaluate:g1", …): status
                    started|committed|failed, attempts, outputs, error
    candidates      a generation trained by a tuning sweep's trial (UNIQUE generation; UNIQUE
                    sweep, trial): outcome finished|stopped|error, epochs run, objective. A
                    candidate is never deployed. A table of its own (not a generation status):
                    stores created before sweeps existed gain it when they are migrated.
    run_locks       who holds a pipeline's run lock (``locks.py``): pipeline, holder, since when
    settings        one value per name: ``storage_root``, the storage root the last writer that
                    knew one was given (locations under it are stored relative, ``locations.py``)
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Optional

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

GENERATION_STATUSES = ("pending", "training", "trained", "failed")
STEP_STATUSES = ("started", "committed", "failed")
BACKFILL_STATUSES = ("started", "committed", "failed")
CANDIDATE_OUTCOMES = ("finished", "stopped", "error")  # ran every epoch | stopped early (ASHA) | raised

# Deterministic constraint names: identical DDL on every backend, and migrations can name them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        datetime: DateTime(timezone=True),
        dict[str, Any]: JSON,
    }


class PipelineRun(Base):
    __tablename__ = "pipeline_runs"
    __table_args__ = (UniqueConstraint("pipeline", "config_sha256"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pipeline: Mapped[str] = mapped_column(String(255))
    config_sha256: Mapped[str] = mapped_column(String(64))
    invocations: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_started_at: Mapped[datetime] = mapped_column(default=utcnow)


class Generation(Base):
    __tablename__ = "generations"
    __table_args__ = (CheckConstraint(_in("status", GENERATION_STATUSES), name="status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    parent_id: Mapped[Optional[int]] = mapped_column(ForeignKey("generations.id"), nullable=True)
    method: Mapped[Optional[str]] = mapped_column(String(255), nullable=True)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    arch: Mapped[Optional[str]] = mapped_column(String(255), nullable=True)
    space: Mapped[Optional[str]] = mapped_column(String(64), nullable=True)
    curv: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    checkpoint_uri: Mapped[Optional[str]] = mapped_column(Text, nullable=True)
    sha256: Mapped[Optional[str]] = mapped_column(String(64), nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Gallery(Base):
    __tablename__ = "galleries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    source_uri: Mapped[Optional[str]] = mapped_column(Text, nullable=True)
    n_items: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    n_shards: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Shard(Base):
    __tablename__ = "shards"
    __table_args__ = (UniqueConstraint("gallery_id", "index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gallery_id: Mapped[int] = mapped_column(ForeignKey("galleries.id"))
    # "index" is a reserved word; SQLAlchemy quotes it on every backend.
    index: Mapped[int] = mapped_column("index", Integer)
    n_items: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    generation_id: Mapped[Optional[int]] = mapped_column(ForeignKey("generations.id"), nullable=True)
    embeddings_uri: Mapped[Optional[str]] = mapped_column(Text, nullable=True)
    index_uri: Mapped[Optional[str]] = mapped_column(Text, nullable=True)
    sha256: Mapped[Optional[str]] = mapped_column(String(64), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Backfill(Base):
    __tablename__ = "backfills"
    __table_args__ = (CheckConstraint(_in("status", BACKFILL_STATUSES), name="status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    shard_id: Mapped[int] = mapped_column(ForeignKey("shards.id"))
    from_generation_id: Mapped[Optional[int]] = mapped_column(ForeignKey("generations.id"), nullable=True)
    to_generation_id: Mapped[int] = mapped_column(ForeignKey("generations.id"))
    items: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="started")
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[Optional[datetime]] = mapped_column(nullable=True)


class Compatibility(Base):
    __tablename__ = "compatibility"
    __table_args__ = (
        UniqueConstraint(
            "query_generation_id", "gallery_generation_id", "metric", "dataset",
            name="uq_compatibility_query_gallery_metric_dataset",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    query_generation_id: Mapped[int] = mapped_column(ForeignKey("generations.id"))
    gallery_generation_id: Mapped[int] = mapped_column(ForeignKey("generations.id"))
    metric: Mapped[str] = mapped_column(String(64))
    # NULL = evaluated but not comparable (NaN in the report: different spaces, no adapter).
    value: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    dataset: Mapped[str] = mapped_column(String(255))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Deployment(Base):
    __tablename__ = "deployments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    generation_id: Mapped[int] = mapped_column(ForeignKey("generations.id"))
    started_at: Mapped[datetime] = mapped_column(default=utcnow)


class Step(Base):
    __tablename__ = "steps"
    __table_args__ = (CheckConstraint(_in("status", STEP_STATUSES), name="status"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(255), unique=True)
    status: Mapped[str] = mapped_column(String(16), default="started")
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    outputs: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[Optional[str]] = mapped_column(Text, nullable=True)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[Optional[datetime]] = mapped_column(nullable=True)


class Candidate(Base):
    __tablename__ = "candidates"
    __table_args__ = (
        UniqueConstraint("sweep", "trial_id"),
        CheckConstraint(_in("outcome", CANDIDATE_OUTCOMES), name="outcome"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    generation_id: Mapped[int] = mapped_column(ForeignKey("generations.id"), unique=True)
    sweep: Mapped[str] = mapped_column(String(255))
    trial_id: Mapped[str] = mapped_column(String(255))
    outcome: Mapped[str] = mapped_column(String(16))
    epochs: Mapped[int] = mapped_column(Integer)
    objective: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class RunLock(Base):
    __tablename__ = "run_locks"

    pipeline: Mapped[str] = mapped_column(String(255), primary_key=True)
    holder: Mapped[str] = mapped_column(Text)
    acquired_at: Mapped[datetime] = mapped_column(default=utcnow)


class Setting(Base):
    __tablename__ = "settings"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


TABLES = tuple(Base.metadata.sorted_tables)
