"""Deployments: which generation serves queries, and since when (a rollback restores shards too)."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.lineage.galleries import assign_in
from orchestrator.lineage.locations import StoreLocations
from orchestrator.lineage.records import DeploymentRecord, ShardAssignment
from orchestrator.lineage.rows import aware, find_gallery, find_generation
from orchestrator.lineage.schema import Candidate, Deployment, Generation, utcnow
from orchestrator.lineage.steps import commit_step_in


def _deployments(session: Session, newest_only: bool) -> list[DeploymentRecord]:
    """Deployments oldest first, or only the newest."""
    stmt = select(Deployment, Generation.name).join(Generation, Deployment.generation_id == Generation.id)
    stmt = stmt.order_by(Deployment.id.desc()).limit(1) if newest_only else stmt.order_by(Deployment.id)
    return [DeploymentRecord(d.id, name, aware(d.started_at)) for d, name in session.execute(stmt)]


class DeploymentsMixin(StoreLocations):
    """Deployments."""

    def deploy(self, generation: str, *, step: Optional[str] = None,
               step_outputs: Optional[Mapping[str, Any]] = None,
               restore: Optional[tuple[str, Sequence[ShardAssignment]]] = None) -> DeploymentRecord:
        """Make ``generation`` (status ``trained``) the one serving queries. Deploying the
        generation that already serves changes nothing. ``restore`` = (gallery, assignments): the
        shards it serves with, applied in the same transaction (a rollback to an earlier
        deployment's shards; every assigned index must exist)."""
        keys = None if step is None else self._key_forms(step)
        outputs = self._stored(step_outputs if step_outputs is not None else {"generation": generation})
        if restore is not None:
            restore = (restore[0], [self._stored_assignment(a) for a in restore[1]])

        def fn(session: Session) -> DeploymentRecord:
            if restore is not None:
                gallery_row = find_gallery(session, restore[0])
                for assignment in restore[1]:
                    if assignment.index >= gallery_row.n_shards:
                        raise ValueError(f"gallery {restore[0]!r} has no shard {assignment.index}")
                    assign_in(session, gallery_row, assignment)
            gen = find_generation(session, generation)
            if gen.status != "trained":
                raise ValueError(f"generation {generation!r} is {gen.status}, only a trained generation can be deployed")
            candidate = session.scalars(select(Candidate).where(Candidate.generation_id == gen.id)).one_or_none()
            if candidate is not None:
                raise ValueError(f"generation {generation!r} is a candidate of sweep {candidate.sweep!r}, never deployed: "
                                 "put its generation block in the pipeline and run the pipeline")
            current = session.scalars(select(Deployment).order_by(Deployment.id.desc()).with_for_update()).first()
            if current is None or current.generation_id != gen.id:
                current = Deployment(generation_id=gen.id, started_at=utcnow())
                session.add(current)
                session.flush()
            if keys is not None:
                commit_step_in(session, keys, outputs)
            return DeploymentRecord(current.id, gen.name, aware(current.started_at))
        return self._write(fn)

    def current_deployment(self) -> Optional[DeploymentRecord]:
        """The newest deployment (the generation serving now), or None."""
        deployments = self._read(lambda s: _deployments(s, newest_only=True))
        return deployments[0] if deployments else None

    def deployments(self) -> list[DeploymentRecord]:
        """Deployment history, oldest first."""
        return self._read(lambda s: _deployments(s, newest_only=False))
