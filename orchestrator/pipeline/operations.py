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
other shard files under ``galleries/<gallery>/`` and Ray Train's epoch checkpoints of generations
whose training committed (their finished checkpoint is saved separately).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from orchestrator.lineage import LineageStore
from orchestrator.lineage.records import DeploymentRecord, ShardAssignment, ShardRecord
from orchestrator.storage import join_uri, read_bytes
from orchestrator.storage.hashing import sha256_hex
from orchestrator.storage.filesystem import open_filesystem, remove
from orchestrator.storage.leases import held_uris

SNAPSHOT_FIELDS = ("index", "generation", "embeddings_uri", "index_uri", "sha256", "n_items")


def shard_snapshot(shards: list[ShardRecord]) -> list[dict[str, Any]]:
    """The shards as JSON rows (what a ``deploy:<gen>`` step records)."""
    return [{name: getattr(s, name) for name in SNAPSHOT_FIELDS} for s in shards]


def redeploy(store: LineageStore, gallery: str, generation: str | None, rollback: bool,
             say: Callable[[str], None]) -> DeploymentRecord:
    """Serve ``generation`` again (or, with ``rollback``, the generation served before the current
    one) with the shards its last deployment recorded. ValueError naming what is missing."""
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
    outputs = store.committed_outputs(f"deploy:{generation}")
    if outputs is None or "shards" not in outputs:
        raise ValueError(f"generation {generation!r} has no recorded deployment with its shards "
                         "(deployed by an older version, or never deployed): run the pipeline to deploy it")
    snapshot = outputs["shards"]
    for row in snapshot:
        if not row["n_items"]:
            continue
        try:
            data = read_bytes(row["embeddings_uri"])
        except FileNotFoundError as missing:
            raise ValueError(f"shard {row['index']} of {generation!r}: {missing} (collected by gc?); "
                             "it cannot be served again") from None
        if sha256_hex(data) != row["sha256"]:
            raise ValueError(f"shard {row['index']} of {generation!r}: {row['embeddings_uri']} no longer has its "
                             f"recorded sha256 {row['sha256'][:12]}…; it cannot be served again")
    restored = [ShardAssignment(**row) for row in snapshot]
    kept = {row["index"] for row in snapshot}
    restored += [ShardAssignment(s.index, generation, None, None, None, 0)
                 for s in store.shards(gallery) if s.index not in kept]  # added later: empty again
    number = len(history) + 1
    record = store.deploy(generation, step=f"redeploy:{generation}:{number}",
                          step_outputs={"generation": generation, "previous": current, "shards": snapshot},
                          restore=(gallery, restored))
    say(f"{generation} serves queries again (was {current}), with the {len(snapshot)} shards of its deployment")
    return record


@dataclasses.dataclass
class Collection:
    """What ``collect_garbage`` removed (or, in a dry run, would remove)."""

    removed: list[str]
    kept: int
    dry_run: bool

    def describe(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        return f"gc: {verb} {len(self.removed)} file(s) / folder(s), kept {self.kept} referenced shard file(s)"


def collect_garbage(store: LineageStore, storage: str, gallery: str, keep_deployments: int,
                    dry_run: bool) -> Collection:
    """Remove shard files and Ray Train epoch checkpoints that nothing retained needs (module
    docstring); never a file the lineage points at."""
    if keep_deployments < 1:
        raise ValueError(f"keep_deployments: at least 1 (the serving deployment), got {keep_deployments}")
    needed = {uri for s in store.shards(gallery) for uri in (s.embeddings_uri, s.index_uri) if uri}
    history = store.deployments()
    for deployment in history[-keep_deployments:]:
        outputs = store.committed_outputs(f"deploy:{deployment.generation}") or {}
        needed |= {row[k] for row in outputs.get("shards", []) for k in ("embeddings_uri", "index_uri") if row[k]}
    needed |= held_uris(storage)  # what a running `orchestrator serve` holds (orchestrator.storage.leases)
    removed: list[str] = []
    fs, root = open_filesystem(join_uri(storage, "galleries", gallery))
    root = root.rstrip("/")
    stored = sorted(p for p in (fs.find(root) if fs.exists(root) else []) if p[len(root):].startswith("/shard-"))
    protocol = "" if "://" not in storage else storage.split("://", 1)[0] + "://"
    unneeded = [protocol + p for p in stored if (protocol + p) not in needed and p not in needed]
    removed += unneeded
    trained = {s.key.split(":", 1)[1] for s in store.steps("train:") if s.status == "committed"}
    ray_root = join_uri(storage, "ray")
    ray_fs, ray_path = open_filesystem(ray_root)
    if ray_fs.exists(ray_path):
        for run in ray_fs.ls(ray_path, detail=False):
            name = str(run).rstrip("/").rsplit("/", 1)[-1]  # train-<generation>-<config sha prefix>
            if name.startswith("train-") and name[len("train-"):].rsplit("-", 1)[0] in trained:
                removed.append(join_uri(ray_root, name))
    if not dry_run:
        for uri in removed:
            remove(uri, recursive=uri.startswith(ray_root), missing_ok=True)
    return Collection(removed, len(stored) - len(unneeded), dry_run)
