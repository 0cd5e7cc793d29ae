"""Operations on a served lineage outside a run: re-point serving to an earlier deployment
(``orchestrator deploy``) and collect the storage nothing retained needs (``orchestrator gc``).

Every ``deploy:<gen>`` step records the shards the generation served with when it was deployed
(``shard_snapshot``). Deploying a generation again restores those shards — their files still in
storage, each embeddings file checked against its recorded sha256 — and records the deployment, in
one lineage transaction; search follows it. Shards added after that deployment (item-level
backfills grow the gallery) are left empty.

``gc`` keeps what the lineage points at now, the shard files of the newest ``keep_deployments``
deployments (the rollback targets), the files a running ``orchestrator serve`` holds (its leases,
``storage.leases``), every generation's checkpoint, plans and reports; it removes
other shard files under ``galleries/<gallery>/``, the parts a killed gallery step staged there
(``staging/``: never served; a run holds the lock gc takes, so none is in use), the rows of a
gallery's store (pgvector, Lance) that nothing retained names (staged by an update that never
committed, or superseded) and Ray Train's epoch checkpoints of generations whose training
committed (their finished checkpoint is saved separately).
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from orchestrator.integrity import IntegrityError, recorded_index
from orchestrator.lineage import LineageStore
from orchestrator.lineage.records import DeploymentRecord, ShardAssignment, ShardRecord
from orchestrator.lineage.step_keys import StepKind, deploy_key, parse_step_key, redeploy_key
from orchestrator.shard_update.parts import STAGING_FOLDER
from orchestrator.storage import join_uri, read_bytes
from orchestrator.storage.filesystem import is_local, open_filesystem, remove
from orchestrator.storage.hashing import sha256_hex
from orchestrator.storage.leases import held_uris
from orchestrator.stores import StoreLocation, is_store_uri, store_at
from orchestrator.stores.lineage import recorded_stores

SNAPSHOT_FIELDS = ("index", "generation", "embeddings_uri", "index_uri", "sha256", "n_items")


def shard_snapshot(shards: list[ShardRecord]) -> list[dict[str, Any]]:
    """The shards as JSON rows (what a ``deploy:<gen>`` step records)."""
    return [{name: getattr(s, name) for name in SNAPSHOT_FIELDS} for s in shards]


def redeploy(store: LineageStore, gallery: str, generation: str | None, rollback: bool,
             say: Callable[[str], None]) -> DeploymentRecord:
    """Serve ``generation`` again (or, with ``rollback``, the generation served before the current
    one) with the shards its last deployment recorded. ValueError naming what is missing,
    IntegrityError naming a shard file that is no longer the recorded one."""
    history = store.deployments()
    if not history:
        raise ValueError("nothing has been deployed yet")
    current = history[-1].generation
    if rollback:
        earlier = [d.generation for d in history if d.generation != current]
        if not earlier:
            raise ValueError(f"{current!r} is the only generation ever deployed: there is nothing to roll back to")
        generation = earlier[-1]
    if generation is None:
        raise ValueError("name the generation to deploy (--generation NAME) or pass --rollback")
    outputs = store.committed_outputs(deploy_key(generation))
    if outputs is None or "shards" not in outputs:
        raise ValueError(f"generation {generation!r} has no recorded deployment with its shards "
                         "(deployed by an older version, or never deployed): run the pipeline to deploy it")
    snapshot = outputs["shards"]
    for row in snapshot:
        if not row["n_items"]:
            continue
        if is_store_uri(row["index_uri"]):  # rows of a store: all still there
            record = recorded_index(store, row["index_uri"])
            held = store_at(row["index_uri"], record).count(row["index_uri"])
            if held != row["n_items"]:
                raise ValueError(f"shard {row['index']} of {generation!r}: {StoreLocation.parse(row['index_uri']).describe()} "
                                 f"holds {held} rows, the deployment recorded {row['n_items']} (collected by gc?); it "
                                 "cannot be served again")
        try:
            data = read_bytes(row["embeddings_uri"])
        except FileNotFoundError as missing:
            raise ValueError(f"shard {row['index']} of {generation!r}: {missing} (collected by gc?); "
                             "it cannot be served again") from None
        if sha256_hex(data) != row["sha256"]:
            raise IntegrityError(f"shard {row['index']} of {generation!r}: {row['embeddings_uri']} no longer has its "
                             f"recorded sha256 {row['sha256'][:12]}…; it cannot be served again")
    restored = [ShardAssignment(**row) for row in snapshot]
    kept = {row["index"] for row in snapshot}
    restored += [ShardAssignment(s.index, generation, None, None, None, 0)
                 for s in store.shards(gallery) if s.index not in kept]  # added later: empty again
    number = len(history) + 1
    record = store.deploy(generation, step=redeploy_key(generation, number),
                          step_outputs={"generation": generation, "previous": current, "shards": snapshot},
                          restore=(gallery, restored))
    say(f"{generation} serves queries again (was {current}), with the {len(snapshot)} shards of its deployment")
    return record


@dataclasses.dataclass
class Collection:
    """What ``collect_garbage`` removed (or, in a dry run, would remove), and the links it left."""

    removed: list[str]
    kept: int
    dry_run: bool
    links: list[str] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        left = f"; left {len(self.links)} link(s) alone (gc never follows or removes links)" if self.links else ""
        return f"gc: {verb} {len(self.removed)} file(s) / folder(s), kept {self.kept} referenced shard file(s){left}"


def collect_garbage(store: LineageStore, storage: str, gallery: str, keep_deployments: int,
                    dry_run: bool) -> Collection:
    """Remove shard files and Ray Train epoch checkpoints that nothing retained needs (module
    docstring); never a file the lineage points at, never a link (nor anything behind one).
    Everything to remove is listed and checked first (each a plain file, each epoch-checkpoint
    folder a real folder); a RuntimeError naming what changed removes nothing."""
    if keep_deployments < 1:
        raise ValueError(f"keep_deployments: at least 1 (the serving deployment), got {keep_deployments}")
    needed = {uri for s in store.shards(gallery) for uri in (s.embeddings_uri, s.index_uri) if uri}
    history = store.deployments()
    for deployment in history[-keep_deployments:]:
        outputs = store.committed_outputs(deploy_key(deployment.generation)) or {}
        needed |= {row[k] for row in outputs.get("shards", []) for k in ("embeddings_uri", "index_uri") if row[k]}
    needed |= held_uris(storage)  # what a running `orchestrator serve` holds (orchestrator.storage.leases)
    stored, links = _shard_files(join_uri(storage, "galleries", gallery))
    unneeded = [uri for uri in stored if uri not in needed]
    stores = recorded_stores(store, gallery=gallery)
    rows = {id(s): [uri for uri in s.locations() if uri not in needed] for s in stores}
    trained = {parse_step_key(s.key).generation for s in store.steps(StepKind.TRAIN.prefix) if s.status == "committed"}
    ray_root = join_uri(storage, "ray")
    ray_runs: list[str] = []
    ray_fs, ray_path = open_filesystem(ray_root)
    if ray_fs.exists(ray_path):
        for run in ray_fs.ls(ray_path, detail=False):
            name = str(run).rstrip("/").rsplit("/", 1)[-1]  # train-<generation>-<config sha prefix>
            if name.startswith("train-") and name[len("train-"):].rsplit("-", 1)[0] in trained:
                uri = join_uri(ray_root, name)
                (links if is_local(uri) and os.path.islink(uri) else ray_runs).append(uri)
    removed = unneeded + ray_runs
    if not dry_run:
        _check_removable(unneeded, ray_runs)
        for uri in removed:
            remove(uri, recursive=uri in ray_runs, missing_ok=True)
        for gallery_store in stores:  # rows nothing retained names: staged by updates that never committed, or superseded
            gallery_store.remove(rows[id(gallery_store)])
    removed += [uri for s in stores for uri in rows[id(s)]]
    return Collection(removed, len(stored) - len(unneeded), dry_run, links)


_COLLECTED = ("/shard-", f"/{STAGING_FOLDER}/")  # the folders of a gallery whose files gc may remove


def _shard_files(gallery_uri: str) -> tuple[list[str], list[str]]:
    """(the files under ``gallery_uri``'s ``shard-*`` and ``staging`` folders, the links met there,
    never followed)."""
    if is_local(gallery_uri):
        root = gallery_uri.removeprefix("file://")
        files, links = [], []
        for directory, dirs, names in os.walk(root):  # os.walk does not descend into linked folders
            for name in sorted(dirs + names):
                path = os.path.join(directory, name)
                if os.path.islink(path):
                    links.append(path)
                elif name in names and path[len(root):].startswith(_COLLECTED):
                    files.append(path)
        return sorted(files), sorted(links)
    fs, root = open_filesystem(gallery_uri)
    root = root.rstrip("/")
    protocol = gallery_uri.split("://", 1)[0] + "://"
    found = fs.find(root) if fs.exists(root) else []
    return sorted(protocol + p for p in found if p[len(root):].startswith(_COLLECTED)), []


def _check_removable(files: list[str], folders: list[str]) -> None:
    """RuntimeError, before anything is removed, unless each of ``files`` is still a plain file and
    each of ``folders`` a real folder (nothing turned into a link or changed kind meanwhile)."""
    wrong = [uri for uri in files if is_local(uri) and (os.path.islink(uri) or not os.path.isfile(uri))]
    wrong += [uri for uri in folders if is_local(uri) and (os.path.islink(uri) or not os.path.isdir(uri))]
    if wrong:
        raise RuntimeError(f"gc: {len(wrong)} path(s) changed kind since they were listed (e.g. {wrong[0]}); "
                           "nothing was removed")
