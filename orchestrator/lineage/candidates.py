"""Sweep candidates: a trial of ``orchestrator tune`` recorded as a generation that is never deployed."""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.lineage.generations import compatibility_keys, upsert_compatibility
from orchestrator.lineage.locations import StoreLocations
from orchestrator.lineage.records import CandidateRecord
from orchestrator.lineage.rows import assign, aware, clean_json, find_generation, float_or_none, generation_names
from orchestrator.lineage.schema import CANDIDATE_OUTCOMES, Candidate, Generation, utcnow


def candidate_record(row: Candidate, name: str, parent: Optional[str]) -> CandidateRecord:
    """The record of a candidate row."""
    return CandidateRecord(name=name, parent=parent, sweep=row.sweep, trial_id=row.trial_id, outcome=row.outcome,
                           epochs=row.epochs, objective=row.objective, created_at=aware(row.created_at),
                           updated_at=aware(row.updated_at))


class CandidatesMixin(StoreLocations):
    """Sweep candidates."""

    def record_candidate(
        self,
        name: str,
        *,
        sweep: str,
        trial_id: str,
        parent: str,
        method: str,
        params: Mapping[str, Any],
        outcome: str,
        epochs: int,
        objective: Optional[float] = None,
        metrics: Optional[Mapping[str, Any]] = None,
        arch: Optional[str] = None,
        space: Optional[str] = None,
        curv: Optional[float] = None,
        checkpoint_uri: Optional[str] = None,
        sha256: Optional[str] = None,
        compatibility: Iterable[Sequence[Any] | Mapping[str, Any]] = (),
    ) -> CandidateRecord:
        """Record one sweep trial as a candidate generation ``name`` (child of ``parent``), in ONE
        transaction: the generation row (status ``failed`` for an errored trial, else ``trained``;
        the checkpoint when the trial wrote one; ``metrics`` replace the recorded ones), its
        candidate row (``outcome`` finished|stopped|error, epochs run, objective) and its
        compatibility values (rows as for ``record_compatibility``). Recording the same trial again
        updates it. A name held by a generation that is not this trial's candidate is a ValueError."""
        if outcome not in CANDIDATE_OUTCOMES:
            raise ValueError(f"candidate outcome must be one of {CANDIDATE_OUTCOMES}, got {outcome!r}")
        wanted = compatibility_keys(compatibility)
        fields = {
            "method": method, "params": clean_json(dict(params)), "arch": arch, "space": space,
            "curv": None if curv is None else float(curv), "checkpoint_uri": self._stored(checkpoint_uri),
            "sha256": sha256,
            "status": "failed" if outcome == "error" else "trained", "metrics": clean_json(dict(metrics or {})),
        }

        def fn(session: Session) -> CandidateRecord:
            parent_row = find_generation(session, parent)
            now = utcnow()
            row = session.scalars(select(Generation).where(Generation.name == name).with_for_update()).one_or_none()
            candidate = None
            if row is not None:
                candidate = session.scalars(select(Candidate).where(Candidate.generation_id == row.id)).one_or_none()
                if candidate is None or (candidate.sweep, candidate.trial_id) != (sweep, trial_id):
                    raise ValueError(f"generation name {name!r} is taken by another generation; a sweep candidate "
                                     "needs a name of its own")
            if row is None:
                row = Generation(name=name, parent_id=parent_row.id, created_at=now, updated_at=now, **fields)
                session.add(row)
                session.flush()
            elif assign(row, parent_id=parent_row.id, **fields):
                row.updated_at = now
            values = {"outcome": outcome, "epochs": int(epochs), "objective": float_or_none(objective)}
            if candidate is None:
                candidate = Candidate(generation_id=row.id, sweep=sweep, trial_id=trial_id, created_at=now,
                                      updated_at=now, **values)
                session.add(candidate)
            elif assign(candidate, **values):
                candidate.updated_at = now
            upsert_compatibility(session, wanted)
            session.flush()
            return candidate_record(candidate, row.name, parent_row.name)
        return self._write(fn)

    def candidates(self, sweep: Optional[str] = None) -> list[CandidateRecord]:
        """Sweep candidates in recording order, of one sweep or all."""
        def fn(session: Session) -> list[CandidateRecord]:
            stmt = (select(Candidate, Generation).join(Generation, Candidate.generation_id == Generation.id)
                    .order_by(Candidate.id))
            if sweep is not None:
                stmt = stmt.where(Candidate.sweep == sweep)
            names = generation_names(session)
            return [candidate_record(c, g.name, names.get(g.parent_id) if g.parent_id else None)
                    for c, g in session.execute(stmt)]
        return self._read(fn)
