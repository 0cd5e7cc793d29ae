"""Pipeline runs and steps: a step starts, commits with its outputs (or fails), and a committed
step is skipped on a re-run (the write protocol of ``store.py``)."""
from __future__ import annotations

import traceback
from typing import Any, Callable, Mapping, Optional, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.lineage.locations import StoreLocations, find_step
from orchestrator.lineage.records import RunRecord, StepRecord
from orchestrator.lineage.rows import assign, aware, clean_json, step_record
from orchestrator.lineage.schema import PipelineRun, Step, utcnow

STEP_SPEC = "spec"  # the key of a step's outputs that holds what it ran from (``start_step(spec=...)``)


def commit_step_in(session: Session, keys: Sequence[str], outputs: Optional[Mapping[str, Any]]) -> Step:
    """Commit a step with its outputs (as recorded, ``StoreLocations._stored``) inside ``session`` (the
    write of a step's result); keeps the spec recorded at its start. ``keys``: the forms of its key
    (``StoreLocations._key_forms``), the one to record first."""
    key = keys[0]
    outputs = clean_json(dict(outputs or {}))
    row = find_step(session, keys, lock=True)
    now = utcnow()
    if row is not None and STEP_SPEC in (row.outputs or {}) and STEP_SPEC not in outputs:
        outputs[STEP_SPEC] = row.outputs[STEP_SPEC]  # what the step ran from, recorded at its start
    if row is None:  # committed without a recorded start: one attempt
        row = Step(key=key, status="committed", attempts=1, outputs=outputs, started_at=now, finished_at=now)
        session.add(row)
    elif row.status != "committed" or row.outputs != outputs or row.key != key:
        assign(row, key=key, status="committed", outputs=outputs, error=None)
        row.finished_at = now
    session.flush()
    return row


class StepsMixin(StoreLocations):
    """Pipeline runs and the steps of the write protocol."""

    def register_run(self, pipeline: str, config_sha256: str) -> RunRecord:
        """Note an invocation of ``pipeline`` with this config: one row per (pipeline, config),
        ``invocations`` counts how often it was (re)started."""
        def fn(session: Session) -> RunRecord:
            row = session.scalars(
                select(PipelineRun).where(PipelineRun.pipeline == pipeline, PipelineRun.config_sha256 == config_sha256)
                .with_for_update()
            ).one_or_none()
            now = utcnow()
            if row is None:
                row = PipelineRun(pipeline=pipeline, config_sha256=config_sha256, invocations=1,
                                  created_at=now, last_started_at=now)
                session.add(row)
            else:
                row.invocations += 1
                row.last_started_at = now
            session.flush()
            return RunRecord(row.pipeline, row.config_sha256, row.invocations,
                             aware(row.created_at), aware(row.last_started_at))
        return self._write(fn)

    def runs(self) -> list[RunRecord]:
        def fn(session: Session) -> list[RunRecord]:
            rows = session.scalars(select(PipelineRun).order_by(PipelineRun.id)).all()
            return [RunRecord(r.pipeline, r.config_sha256, r.invocations, aware(r.created_at),
                              aware(r.last_started_at)) for r in rows]
        return self._read(fn)

    def get_step(self, key: str) -> Optional[StepRecord]:
        keys = self._key_forms(key)

        def fn(session: Session) -> Optional[StepRecord]:
            row = find_step(session, keys)
            return None if row is None else step_record(row)
        return self._read(fn)

    def step_status(self, key: str) -> Optional[str]:
        """``"started"``, ``"committed"``, ``"failed"``, or None for a step never started."""
        step = self.get_step(key)
        return None if step is None else step.status

    def start_step(self, key: str, *, rerun: bool = False, spec: Optional[Mapping[str, Any]] = None) -> StepRecord:
        """Record that step ``key`` starts. A new key gets one row (attempts=1); a started or
        failed one (a crash or an error last time) is reset to started with attempts+1. A
        committed step is left alone and returned as is — the caller skips it — unless
        ``rerun=True``, which restarts it like a failed one. ``spec`` (JSON: what the step runs
        from) is kept with its outputs under ``STEP_SPEC`` when it commits."""
        started_outputs = {} if spec is None else {STEP_SPEC: self._stored(dict(spec))}
        keys = self._key_forms(key)

        def fn(session: Session) -> StepRecord:
            row = find_step(session, keys, lock=True)
            now = utcnow()
            if row is None:
                row = Step(key=keys[0], status="started", attempts=1, outputs=started_outputs, started_at=now)
                session.add(row)
            elif row.status != "committed" or rerun:
                row.key = keys[0]
                row.attempts += 1
                row.status = "started"
                row.outputs = started_outputs
                row.error = None
                row.started_at = now
                row.finished_at = None
            session.flush()
            return step_record(row)
        return self._write(fn)

    def commit_step(self, key: str, outputs: Optional[Mapping[str, Any]] = None) -> StepRecord:
        """Mark step ``key`` committed with its (JSON) outputs, e.g. URIs of the files it wrote —
        which must already be in place. Committing a committed step with the same outputs
        changes nothing."""
        keys, stored = self._key_forms(key), self._stored(dict(outputs or {}))
        return self._write(lambda session: step_record(commit_step_in(session, keys, stored)))

    def fail_step(self, key: str, error: str | BaseException) -> StepRecord:
        """Mark step ``key`` failed with an error text (an exception is stored with its traceback).
        A committed step cannot fail afterwards (ValueError)."""
        if isinstance(error, BaseException):
            error = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        keys = self._key_forms(key)

        def fn(session: Session) -> StepRecord:
            row = find_step(session, keys, lock=True)
            now = utcnow()
            if row is None:
                row = Step(key=keys[0], status="failed", attempts=1, outputs={}, error=error, started_at=now, finished_at=now)
                session.add(row)
            elif row.status == "committed":
                raise ValueError(f"step {key!r} is already committed; it cannot fail")
            else:
                row.status, row.error, row.finished_at = "failed", error, now
            session.flush()
            return step_record(row)
        return self._write(fn)

    def committed_outputs(self, key: str) -> Optional[dict[str, Any]]:
        """The outputs of a committed step, or None when ``key`` has not committed."""
        step = self.get_step(key)
        return dict(step.outputs) if step is not None and step.status == "committed" else None

    def run_step(self, key: str, fn: Callable[[], Optional[Mapping[str, Any]]]) -> dict[str, Any]:
        """Run ``fn`` as step ``key`` unless it already committed: start → fn() (writes its files,
        returns outputs) → commit. An exception marks the step failed and propagates.
        Returns the committed outputs (the recorded ones when skipped)."""
        step = self.start_step(key)
        if step.status == "committed":
            return dict(step.outputs)
        try:
            outputs = fn()
        except BaseException as exc:
            self.fail_step(key, exc)
            raise
        return dict(self.commit_step(key, outputs).outputs)

    def steps(self, prefix: Optional[str] = None) -> list[StepRecord]:
        return self._resolved(self.steps_as_recorded(prefix))

    def steps_as_recorded(self, prefix: Optional[str] = None) -> list[StepRecord]:
        """``steps`` with their locations as recorded (``storage:<path>``, unresolved): for a
        reader that resolves each step itself (``StorageRoot.resolve_json``), so that one location
        leaving the storage root is that step's problem, not every step's ValueError."""
        def fn(session: Session) -> list[StepRecord]:
            stmt = select(Step).order_by(Step.id)
            if prefix:
                stmt = stmt.where(self._key_prefix_filter(prefix))
            return [step_record(row) for row in session.scalars(stmt)]
        return StoreLocations._read_as_recorded(self, fn)
