"""Storage against lineage: ``orchestrator verify`` (like ``git fsck``) and the run's guards.

``verify_storage`` checks every file the lineage hashes against the hashes it holds
(``orchestrator.integrity``): each trained generation's card and weights and its stored
evaluation embeddings, each shard's Parquet file (sha256, and its id set against the one its
index was built from) and index file (sha256 of the whole file, header included), the shard files
of earlier deployments kept for a rollback, each committed gallery plan (which must lie in
the storage), and a Ray Data gallery's snapshot (its manifest's sha256, its files' sizes). A step whose recorded
location would leave the storage root is a problem, not an
abort. A lineage that hashes no file verifies nothing: not ``ok``. It also lists *orphans* (files the lineage names that are
missing) and *unreferenced* files (under ``generations/`` or ``galleries/`` of the storage, named
nowhere in the lineage). Mismatches and orphans are errors; unreferenced files are listed only.

``adopt_unhashed`` records the hashes a lineage written before them lacks (``verify --adopt``).

The guards keep a run from replacing what the lineage does not know: ``refuse_unknown_storage``
(an empty lineage next to a storage holding artefacts) and ``refuse_unknown_file`` (a file in the
way of a step's first attempt).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

from orchestrator.integrity import (
    EVAL_EMBEDDINGS,
    IntegrityError,
    check_checkpoint,
    check_index_bytes,
    ids_sha256,
    index_record,
    recorded_card_sha256,
    recorded_index,
    sha256_bytes,
    trained_outputs,
)
from orchestrator.lineage.locations import StorageRoot
from orchestrator.lineage.step_keys import StepKind, integrity_key, integrity_location, kind_of, map_location, train_key
from orchestrator.models.checkpoint_layout import CARD_FILE, WEIGHTS_FILE
from orchestrator.pipeline.gallery.snapshot import check_snapshot
from orchestrator.storage import join_uri, read_bytes, read_json, redact_uri
from orchestrator.storage.overwrite import UnknownArtefact, refuse_file_on_first_attempt

#: Folders of the storage root that hold artefacts the lineage must know.
ARTEFACT_FOLDERS = ("generations", "galleries")


@dataclass
class Verification:
    """What ``verify_storage`` found: ``checked`` files, ``problems`` (mismatches, orphans), ``unreferenced``."""

    checked: int = 0
    problems: list[str] = field(default_factory=list)
    unreferenced: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No problem, and something checked: a lineage that hashes no file verifies nothing."""
        return not self.problems and self.checked > 0

    def lines(self) -> list[str]:
        nothing = [] if self.checked else [
            "NOTHING CHECKED: the lineage hashes no stored file"
            + (f", but the storage holds {len(self.unreferenced)} artefact file(s): a lost or emptied lineage "
               "(`orchestrator verify FILE --rebuild-lineage` rebuilds it from them)" if self.unreferenced else "")]
        return ([f"MISMATCH {p}" for p in self.problems] + [f"unreferenced {u}" for u in self.unreferenced] + nothing
                + [f"{self.checked} file(s) checked, {len(self.problems)} problem(s), "
                   f"{len(self.unreferenced)} unreferenced file(s)"])


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def stored_files(storage: str) -> list[str]:
    """Every file under the artefact folders of a local storage root (absolute paths, sorted)."""
    found = []
    for folder in ARTEFACT_FOLDERS:
        for directory, _dirs, files in os.walk(os.path.join(storage, folder)):
            found += [os.path.join(directory, name) for name in files if not name.startswith(".")]
    return sorted(found)


def known_files(store, steps=None) -> set[str]:
    """Every path the lineage names: checkpoints, shard files, and any path in a step's outputs
    or in a plan file a step names (selection files). ``steps``: the lineage's steps, resolved
    (``resolved_steps``; default: all of them)."""
    known: set[str] = set()
    root = store.storage_root
    for record in store.list_generations():
        if record.checkpoint_uri:
            known |= {join_uri(record.checkpoint_uri, CARD_FILE), join_uri(record.checkpoint_uri, WEIGHTS_FILE)}
    for step in store.steps() if steps is None else steps:
        location = integrity_location(step.key)
        if location is not None:
            known.add(location)
        known |= set(_strings(step.outputs))
        plan = step.outputs.get("plan_uri")
        if step.status == "committed" and isinstance(plan, str) and os.path.exists(plan):
            try:
                plan_json = read_json(plan)
            except ValueError:  # an unreadable plan: verify reports its hash
                continue
            known |= set(_strings(plan_json if root is None else root.resolve_json(plan_json)))
    for gallery in store.galleries():
        for shard in store.shards(gallery.name):
            known |= {uri for uri in (shard.embeddings_uri, shard.index_uri) if uri}
    return known


def resolved_steps(store, root: StorageRoot) -> tuple[list, list[str]]:
    """(the lineage's steps with their locations resolved against ``root``, a problem line for
    each step whose recorded location would leave the root: that step is left out, not every one)."""
    steps, problems = [], []
    for step in store.steps_as_recorded():
        try:
            steps.append(dataclasses.replace(step, key=map_location(step.key, root.resolve),
                                             outputs=root.resolve_json(step.outputs)))
        except ValueError as error:
            problems.append(f"step {step.key}: {error}")
    return steps, problems


def _check(result: Verification, what: str, check) -> None:
    result.checked += 1
    try:
        check()
    except FileNotFoundError as missing:
        result.problems.append(f"{what}: missing (orphan): {missing}")
    except (IntegrityError, ValueError) as error:  # ValueError: ChecksumMismatch, an unreadable file
        result.problems.append(f"{what}: {error}")


def _check_sha256(uri: str, expected: str, what: str) -> None:
    actual = sha256_bytes(read_bytes(uri))
    if actual != expected:
        raise IntegrityError(f"{redact_uri(uri)}: {what} changed since it was written: sha256 {actual}, "
                             f"the lineage holds {expected}")


def _check_index_file(store, uri: str, n_items: int | None) -> None:
    check_index_bytes(read_bytes(uri), uri, recorded_index(store, uri), n_items)


def _check_shard(store, shard) -> None:
    from orchestrator.gallery import read_recorded_shard
    from orchestrator.stores import is_store_uri, store_at

    stored = read_recorded_shard(shard)
    record = recorded_index(store, shard.index_uri)
    if is_store_uri(shard.index_uri):  # the rows of a store: their count and digest
        store_at(shard.index_uri, record).check_shard(shard.index_uri, record, shard.n_items)
    else:
        check_index_bytes(read_bytes(shard.index_uri), shard.index_uri, record, shard.n_items)
    if ids_sha256(stored.ids) != record["ids_sha256"]:
        raise IntegrityError(f"{shard.index_uri}: the index was built over other items than shard {shard.index}'s "
                             f"file {shard.embeddings_uri} holds")


def _check_plan(outputs: dict[str, Any], root: StorageRoot) -> None:
    plan = outputs["plan_uri"]
    if root.relative(plan) == plan:
        raise IntegrityError(f"{redact_uri(plan)}: the plan's recorded location lies outside the storage "
                             f"{redact_uri(root.uri)}")
    _check_sha256(plan, outputs["sha256"], "plan file")


def verify_storage(store, storage: str) -> Verification:
    """Check the storage at (local) root ``storage`` against ``store``; see the module docstring."""
    result = Verification()
    root = StorageRoot(storage)
    steps, result.problems = resolved_steps(store, root)
    committed = [step for step in steps if step.status == "committed"]
    for record in store.list_generations():
        if record.checkpoint_uri and record.status == "trained":
            _check(result, f"generation {record.name} checkpoint", lambda r=record: check_checkpoint(store, r))
    current: set[str] = set()
    for gallery in store.galleries():
        for shard in store.shards(gallery.name):
            if shard.n_items and shard.embeddings_uri:
                current |= {shard.embeddings_uri, shard.index_uri}
                _check(result, f"gallery {gallery.name} shard {shard.index}", lambda s=shard: _check_shard(store, s))
    for step in committed:
        evaluation = step.outputs.get(EVAL_EMBEDDINGS) if kind_of(step.key) is StepKind.EVALUATE else None
        if isinstance(evaluation, dict) and "sha256" in evaluation:
            _check(result, f"{step.key} evaluation embeddings",
                   lambda e=evaluation: _check_sha256(e["uri"], e["sha256"], "evaluation embeddings"))
        if kind_of(step.key) is StepKind.PLAN and "sha256" in step.outputs:
            _check(result, f"plan {step.key}", lambda o=step.outputs: _check_plan(o, root))
        if kind_of(step.key) is StepKind.SOURCE and "manifest_uri" in step.outputs:
            _check(result, f"gallery snapshot {step.key}", lambda o=step.outputs: check_snapshot(o))
    _check_superseded(store, committed, current, result)
    known = known_files(store, steps)
    result.unreferenced = [path for path in stored_files(storage) if path not in known]
    result.unreferenced += _staged_rows(store, steps, known, result)
    return result


def _staged_rows(store, steps, known: set[str], result: Verification) -> list[str]:
    """The locations of rows the gallery's stores hold that the lineage names nowhere: an update's
    rows staged by a run that never committed it (no query reaches them; ``gc`` removes them)."""
    from orchestrator.errors import OutsideSystemError
    from orchestrator.stores.lineage import recorded_stores

    staged = []
    stores = recorded_stores(store, steps)
    folders = tuple(s.path.rstrip("/") + "/" for s in stores if s.kind == "lance")
    result.unreferenced = [path for path in result.unreferenced if not path.startswith(folders)] if folders \
        else result.unreferenced  # a Lance store's own files: its rows are checked, not its files
    for gallery_store in stores:
        try:
            staged += [uri for uri in gallery_store.locations() if uri not in known]
        except OutsideSystemError as error:
            result.problems.append(f"{gallery_store.describe()}: {error}")
    return staged


def _check_superseded(store, committed: list, current: set[str], result: Verification) -> None:
    """The shard files a deployment recorded that no shard serves now (kept for a rollback) and
    any other index file the lineage hashed: each one still stored must be the one recorded (one
    gc collected is not a problem: ``deploy`` refuses to serve it again, naming it)."""
    seen = set(current)
    for step in committed:
        if kind_of(step.key) in (StepKind.DEPLOY, StepKind.REDEPLOY):
            for row in step.outputs.get("shards") or []:
                if not row.get("n_items") or row["embeddings_uri"] in seen or not os.path.exists(row["embeddings_uri"]):
                    continue
                seen.add(row["embeddings_uri"])
                _check(result, f"{step.key} shard {row['index']} (kept for a rollback)",
                       lambda r=row: _check_sha256(r["embeddings_uri"], r["sha256"], "shard file"))
    from orchestrator.stores import is_store_uri, store_at

    for step in committed:
        uri = integrity_location(step.key)
        if uri and uri not in seen and is_store_uri(uri):
            seen.add(uri)
            gallery_store = store_at(uri, step.outputs)
            if gallery_store.count(uri):  # rows gc collected are not a problem (deploy refuses them)
                _check(result, f"rows {uri} (kept for a rollback)",
                       lambda u=uri, o=step.outputs, g=gallery_store: g.check_shard(u, o))
            continue
        if uri and uri not in seen and os.path.exists(uri):
            seen.add(uri)
            _check(result, f"index {uri} (kept for a rollback)",
                   lambda u=uri, o=step.outputs: _check_index_file(store, u, o.get("n_items")))


def adopt_unhashed(store) -> list[str]:
    """Record the hashes a lineage written before ``orchestrator.integrity`` lacks, trusting the
    files as they are now (an operator's explicit choice, ``verify --adopt``): each trained
    generation's card (its weights must still match the lineage), each current shard's index (its
    Parquet file must match the lineage, and the index hold as many items). Returns what it recorded."""
    from orchestrator.gallery import read_recorded_shard
    from orchestrator.index.factory import index_from_bytes

    adopted = []
    for record in store.list_generations():
        key = train_key(record.name)
        outputs = store.committed_outputs(key)
        if record.checkpoint_uri and outputs is not None and recorded_card_sha256(store, record.name) is None:
            weights = join_uri(record.checkpoint_uri, WEIGHTS_FILE)
            if sha256_bytes(read_bytes(weights)) != record.sha256:
                raise IntegrityError(f"{weights}: weights of generation {record.name!r} changed since training")
            store.commit_step(key, {**outputs, **trained_outputs(record.checkpoint_uri, record.sha256)})
            adopted.append(join_uri(record.checkpoint_uri, CARD_FILE))
    for gallery in store.galleries():
        for shard in store.shards(gallery.name):
            if shard.n_items and shard.index_uri and recorded_index(store, shard.index_uri) is None:
                ids = read_recorded_shard(shard).ids
                data = read_bytes(shard.index_uri)
                if index_from_bytes(data).ntotal != len(ids):
                    raise IntegrityError(f"{shard.index_uri}: holds other items than {shard.embeddings_uri}")
                store.commit_step(integrity_key(shard.index_uri), index_record(data, ids))
                adopted.append(shard.index_uri)
    return adopted


def refuse_unknown_storage(store, storage: str, lineage: str) -> None:
    """UnknownArtefact when the lineage knows no generation but the storage holds artefacts: the
    lineage was lost or emptied, and a run would retrain and overwrite them."""
    if store.list_generations():
        return
    files = stored_files(storage)
    if files:
        raise UnknownArtefact(
            f"lineage {lineage} is empty but storage {storage} holds {len(files)} artefact file(s) it does not know "
            f"(e.g. {files[0]}); refusing to run over them. Restore the lineage (the `lineage:` of the pipeline "
            f"file), or move {', '.join(os.path.join(storage, f) for f in ARTEFACT_FOLDERS)} away to start afresh")


def refuse_unknown_file(store, key: str, uri: str) -> None:
    """UnknownArtefact when ``uri`` exists although step ``key`` is on its first attempt (so no
    earlier attempt of it wrote the file, and the lineage does not know it)."""
    step = store.get_step(key)
    refuse_file_on_first_attempt(key, uri, step is not None and step.attempts <= 1)
