"""Generations (their definition, status and checkpoint) and the compatibility values between them."""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.lineage.locations import StoreLocations
from orchestrator.lineage.records import CompatibilityRecord, GenerationRecord
from orchestrator.lineage.rows import (
    assign,
    clean_json,
    find_generation,
    find_generations,
    float_or_none,
    generation_names,
    generation_record,
)
from orchestrator.lineage.schema import GENERATION_STATUSES, Compatibility, Generation, utcnow
from orchestrator.lineage.steps import commit_step_in


def _check_no_cycle(session: Session, row: Generation, parent_row: Generation) -> None:
    """ValueError when ``parent_row`` descends from ``row``."""
    parent_of = dict(session.execute(select(Generation.id, Generation.parent_id)).all())
    cursor: Optional[int] = parent_row.id
    while cursor is not None:
        if cursor == row.id:
            raise ValueError(f"making {parent_row.name!r} the parent of {row.name!r} would create a cycle")
        cursor = parent_of.get(cursor)


def compatibility_keys(rows: Iterable[Sequence[Any] | Mapping[str, Any]]) -> dict[tuple[str, str, str, str], Optional[float]]:
    """Compatibility rows (tuples or mappings) as {(query, gallery, metric, dataset): value or None}."""
    wanted: dict[tuple[str, str, str, str], Optional[float]] = {}
    for row in rows:
        if isinstance(row, Mapping):
            query, gallery, metric, value, dataset = (row[k] for k in ("query", "gallery", "metric", "value", "dataset"))
        else:
            query, gallery, metric, value, dataset = row
        wanted[(str(query), str(gallery), str(metric), str(dataset))] = float_or_none(value)
    return wanted


def upsert_compatibility(session: Session, wanted: Mapping[tuple[str, str, str, str], Optional[float]]) -> None:
    """Insert or update the ``wanted`` compatibility values inside ``session``."""
    gens = find_generations(session, {k[0] for k in wanted} | {k[1] for k in wanted})
    existing: dict[tuple[int, int, str, str], Compatibility] = {}
    if wanted:
        stmt = select(Compatibility).where(
            Compatibility.query_generation_id.in_({gens[k[0]].id for k in wanted}),
            Compatibility.dataset.in_({k[3] for k in wanted}),
        ).with_for_update()
        for c in session.scalars(stmt):
            existing[(c.query_generation_id, c.gallery_generation_id, c.metric, c.dataset)] = c
    now = utcnow()
    for (query, gallery, metric, dataset), value in wanted.items():
        key = (gens[query].id, gens[gallery].id, metric, dataset)
        row = existing.get(key)
        if row is None:
            session.add(Compatibility(query_generation_id=key[0], gallery_generation_id=key[1],
                                      metric=metric, value=value, dataset=dataset, updated_at=now))
        elif assign(row, value=value):
            row.updated_at = now


class GenerationsMixin(StoreLocations):
    """Generations and compatibility values."""

    def upsert_generation(
        self,
        name: str,
        parent: Optional[str] = None,
        method: Optional[str] = None,
        params: Optional[Mapping[str, Any]] = None,
        arch: Optional[str] = None,
        space: Optional[str] = None,
        curv: Optional[float] = None,
        status: Optional[str] = None,
    ) -> GenerationRecord:
        """Create generation ``name`` (status ``pending`` unless given) or update it. On update,
        arguments left as None keep the recorded value. A trained generation's definition
        (parent, method, params, arch, space, curv) is frozen: a different value raises
        ValueError — train it under a new name. Unknown parent → LookupError."""
        if status is not None and status not in GENERATION_STATUSES:
            raise ValueError(f"generation status must be one of {GENERATION_STATUSES}, got {status!r}")
        if parent is not None and parent == name:
            raise ValueError(f"generation {name!r} cannot be its own parent")
        clean_params = None if params is None else clean_json(dict(params))
        clean_curv = None if curv is None else float(curv)

        def fn(session: Session) -> GenerationRecord:
            parent_row = find_generation(session, parent) if parent is not None else None
            row = session.scalars(select(Generation).where(Generation.name == name).with_for_update()).one_or_none()
            now = utcnow()
            if row is None:
                row = Generation(
                    name=name, parent_id=parent_row.id if parent_row else None, method=method,
                    params=clean_params or {}, arch=arch, space=space, curv=clean_curv,
                    status=status or "pending", metrics={}, created_at=now, updated_at=now,
                )
                session.add(row)
            else:
                wanted: dict[str, Any] = {
                    "parent_id": parent_row.id if parent_row else None, "method": method,
                    "params": clean_params, "arch": arch, "space": space, "curv": clean_curv,
                }
                wanted = {k: v for k, v in wanted.items() if v is not None}
                if parent_row is not None:
                    _check_no_cycle(session, row, parent_row)
                if row.status == "trained":
                    differ = sorted(k for k, v in wanted.items() if getattr(row, k) != v)
                    if differ:
                        fields = ", ".join("parent" if k == "parent_id" else k for k in differ)
                        raise ValueError(
                            f"generation {name!r} is already trained with a different {fields}; "
                            "record the new model under a new generation name"
                        )
                if status is not None:
                    wanted["status"] = status
                if assign(row, **wanted):
                    row.updated_at = now
            session.flush()
            return generation_record(row, generation_names(session))
        return self._write(fn)

    def set_generation_status(self, name: str, status: str) -> GenerationRecord:
        """Set the status (``training`` when a train step starts, ``failed`` when it fails)."""
        if status not in GENERATION_STATUSES:
            raise ValueError(f"generation status must be one of {GENERATION_STATUSES}, got {status!r}")

        def fn(session: Session) -> GenerationRecord:
            row = find_generation(session, name, lock=True)
            if assign(row, status=status):
                row.updated_at = utcnow()
            session.flush()
            return generation_record(row, generation_names(session))
        return self._write(fn)

    def mark_generation_trained(
        self,
        name: str,
        checkpoint_uri: str,
        sha256: Optional[str] = None,
        metrics: Optional[Mapping[str, Any]] = None,
        *,
        step: Optional[str] = None,
        step_outputs: Optional[Mapping[str, Any]] = None,
    ) -> GenerationRecord:
        """Record the finished checkpoint (already written and renamed into place): status
        ``trained``, checkpoint URI and sha256, ``metrics`` merged into the recorded ones.
        With ``step``, that step commits in the same transaction."""
        clean_metrics = clean_json(dict(metrics or {}))
        checkpoint_uri = self._stored(checkpoint_uri)
        keys = None if step is None else self._key_forms(step)
        outputs = self._stored(step_outputs if step_outputs is not None
                               else {"checkpoint_uri": checkpoint_uri, "sha256": sha256})

        def fn(session: Session) -> GenerationRecord:
            row = find_generation(session, name, lock=True)
            merged = {**(row.metrics or {}), **clean_metrics}
            if assign(row, status="trained", checkpoint_uri=checkpoint_uri, sha256=sha256, metrics=merged):
                row.updated_at = utcnow()
            if keys is not None:
                commit_step_in(session, keys, outputs)
            session.flush()
            return generation_record(row, generation_names(session))
        return self._write(fn)

    def get_generation(self, name: str) -> GenerationRecord:
        return self._read(lambda session: generation_record(find_generation(session, name), generation_names(session)))

    def has_generation(self, name: str) -> bool:
        return self._read(lambda s: s.scalar(select(Generation.id).where(Generation.name == name)) is not None)

    def list_generations(self) -> list[GenerationRecord]:
        """All generations, parents before children: depth-first from the roots, siblings in
        creation order (so each subtree is contiguous, the order a tree is drawn in)."""
        def fn(session: Session) -> list[GenerationRecord]:
            rows = session.scalars(select(Generation).order_by(Generation.id)).all()
            names = {row.id: row.name for row in rows}
            children: dict[Optional[int], list[Generation]] = {}
            for row in rows:
                parent = row.parent_id if row.parent_id in names else None
                children.setdefault(parent, []).append(row)
            ordered: list[GenerationRecord] = []
            stack = list(reversed(children.get(None, [])))
            while stack:
                row = stack.pop()
                ordered.append(generation_record(row, names))
                stack.extend(reversed(children.get(row.id, [])))
            return ordered
        return self._read(fn)

    def record_compatibility(
        self,
        rows: Iterable[Sequence[Any] | Mapping[str, Any]],
        *,
        step: Optional[str] = None,
        step_outputs: Optional[Mapping[str, Any]] = None,
    ) -> int:
        """Upsert compatibility values. Each row is ``(query, gallery, metric, value, dataset)``
        or a mapping with those keys; NaN/None values are stored as NULL (no common distance).
        All rows in one transaction (plus the commit of ``step``, if given). Returns the number
        of distinct (query, gallery, metric, dataset) keys written."""
        wanted = compatibility_keys(rows)
        keys = None if step is None else self._key_forms(step)
        outputs = self._stored(step_outputs if step_outputs is not None else {"values": len(wanted)})

        def fn(session: Session) -> int:
            upsert_compatibility(session, wanted)
            if keys is not None:
                commit_step_in(session, keys, outputs)
            session.flush()
            return len(wanted)
        return self._write(fn)

    def compatibility_values(self, dataset: Optional[str] = None) -> list[CompatibilityRecord]:
        """Recorded values (all datasets, or one), ordered by query, gallery, dataset, metric."""
        def fn(session: Session) -> list[CompatibilityRecord]:
            stmt = select(Compatibility).order_by(
                Compatibility.query_generation_id, Compatibility.gallery_generation_id,
                Compatibility.dataset, Compatibility.metric,
            )
            if dataset is not None:
                stmt = stmt.where(Compatibility.dataset == dataset)
            names = generation_names(session)
            return [CompatibilityRecord(names[c.query_generation_id], names[c.gallery_generation_id],
                                        c.metric, c.value, c.dataset) for c in session.scalars(stmt)]
        return self._read(fn)
