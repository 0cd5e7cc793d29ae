"""Executing a generation's gallery plan: ``embed:<gallery>/<shard>:<gen>`` and
``split:<gallery>/<shard>:<gen>`` steps, one per plan entry not yet committed.

Every pending entry (a ``ShardUpdate``) is started, and all of them run as one Ray Data pipeline
(``distributed.gallery_step``): workers read the entries' items, embed them, stage the embedded
rows, and write each shard's Parquet file and FAISS index (for a split: the source shard without
the moved items too) under content-addressed names. The driver receives per entry only what the
lineage records (URIs, sha256s, counts) and commits it as it comes: the index records, then the
shard rows moved to the new generation in one lineage transaction together with the step; then
the entry's staged parts are removed. The commit alone makes files served; files of an update
that never committed are reported by ``verify`` and removed by ``gc``.

Exactly once: a crash (of the driver or a worker) leaves each shard wholly old or wholly new; the
re-run runs only the entries whose step has not committed, as a new attempt, which may rewrite
what the crashed attempt left. On its first attempt a step never overwrites an existing file.
Ray Data retries a stage's task lost with its worker on its own (a retried part is the same
file); an update whose final write is lost is written again from its parts, as a new attempt.
"""
from __future__ import annotations

import dataclasses
import time

from orchestrator.distributed.gallery_step import run_shard_updates
from orchestrator.distributed.generation_model import GenerationModel
from orchestrator.geometry.geometry import Geometry
from orchestrator.integrity import index_steps
from orchestrator.lineage.records import ShardAssignment
from orchestrator.pipeline.gallery.context import GalleryContext
from orchestrator.pipeline.gallery.plan import GalleryPlan
from orchestrator.progress import Meter
from orchestrator.shard_update import ShardTarget, ShardUpdate, ShardUpdateResult, UpdateKind
from orchestrator.shard_update.parts import step_staging
from orchestrator.storage import remove
from orchestrator.stores import store_of
from orchestrator.stores.lineage import record_store

MAX_ATTEMPTS_PER_RUN = 3  # final writes of one update in one execution when their workers are lost


class GalleryExecutor:
    """Runs the pending entries of a committed plan through the Ray Data step and commits each result."""

    def __init__(self, ctx: GalleryContext):
        self.ctx = ctx
        self._runs: dict[str, int] = {}
        self.first_staged: tuple[float, int] | None = None  # (Unix time, items) of the last execute's first part

    def execute(self, plan: GalleryPlan, generation: str) -> list[ShardUpdateResult]:
        """Run every entry of ``plan`` whose step has not committed, commit each as it completes;
        returns what the workers reported (metadata only: URIs, hashes, counts, nodes, times)."""
        ctx, store = self.ctx, self.ctx.store
        pending = [e for e in plan.entries if store.step_status(e.step_key(ctx.name, generation)) != "committed"]
        skipped = len(plan.entries) - len(pending)
        if skipped:
            ctx.say(f"{ctx.name}: {skipped} shard update(s) of {generation} already committed, skipped")
        if not pending:
            return []
        for entry in pending:
            if entry.kind is UpdateKind.EMBED and plan.before[entry.shard].generation is not None:
                store.start_backfill(ctx.name, entry.shard, generation, items=entry.num_items)
        target = self._target()
        gallery_store = target.gallery_store()
        if gallery_store.kind != "files":
            gallery_store.check_reachable()
            record_store(store, ctx.name, gallery_store)
        updates = [self._started(entry, generation, plan) for entry in pending]
        ctx.ensure_ray()
        resources = ctx.spec.embedding
        started = {update.key: update for update in updates}
        total = sum(e.num_items for e in pending)
        low, high = resources.pool_size
        pool = f"{low}" if low == high else f"{low}-{high}"
        ctx.say(f"{ctx.name}: embedding {total} items of {len(pending)} shard update(s) with {generation} on Ray Data "
                f"({pool} embedding actor(s){' on GPUs' if resources.num_gpus else ''}, batch {resources.batch_size})")
        results = []
        self.first_staged = None
        try:
            with Meter(ctx.say, f"{ctx.name}: embedded", total, "items") as meter:
                def staged(n_items: int) -> None:
                    self.first_staged = self.first_staged or (time.time(), n_items)
                    meter.advance(n_items)

                for result in run_shard_updates(ctx.source, updates, self._generation_model(generation), target,
                                                resources, self._run_again, staged):
                    self._commit(started[result.key], result, generation)
                    results.append(result)
            for update in updates:  # a batch Ray Data ran twice (its actor lost) may stage after its commit
                remove(step_staging(ctx.root, update.key), recursive=True, missing_ok=True)
        except BaseException as error:
            for update in updates:
                if store.step_status(update.key) == "started":
                    store.fail_step(update.key, error)
            raise
        return results

    def _started(self, entry: ShardUpdate, generation: str, plan: GalleryPlan) -> ShardUpdate:
        """Start ``entry``'s step (an attempt more): the update as its workers receive it, reading
        its gallery rows or the shard's file as the plan found it (a split's step has not committed,
        so its shard still holds that file)."""
        key = entry.step_key(self.ctx.name, generation)
        step = self.ctx.store.start_step(key)
        self._runs[key] = 1
        before = plan.before[entry.shard]
        source = None if entry.rows is not None else (before.embeddings_uri, before.sha256)
        return entry.started(key, step.attempts <= 1, source)

    def _run_again(self, update: ShardUpdate, error: BaseException) -> ShardUpdate | None:
        """The worker writing ``update``'s files was lost: write them again as a new attempt of its
        step, unless it already ran ``MAX_ATTEMPTS_PER_RUN`` times in this execution."""
        if self._runs[update.key] >= MAX_ATTEMPTS_PER_RUN:
            return None
        self._runs[update.key] += 1
        store = self.ctx.store
        store.fail_step(update.key, error)
        store.start_step(update.key)
        self.ctx.say(f"{update.key}: its worker was lost ({type(error).__name__}); running it again")
        return dataclasses.replace(update, first_attempt=False)

    def _generation_model(self, generation: str) -> GenerationModel:
        record = self.ctx.store.get_generation(generation)
        model = self.ctx.model(generation)
        geometry = Geometry(model.space, model.curv)
        return GenerationModel(generation, record.checkpoint_uri, record.sha256, geometry.space.value,
                               float(geometry.curv), self.ctx.image_size, self.ctx.source.image_format, tuple(self.ctx.mean),
                               tuple(self.ctx.std))

    def _target(self) -> ShardTarget:
        spec = self.ctx.spec
        store = None if spec.store.kind == "files" else store_of(spec.store, self.ctx.root, self.ctx.name, spec.index,
                                                                  dict(spec.index_options))
        return ShardTarget(self.ctx.root, spec.index, dict(spec.index_options), store=store)

    def _commit(self, entry: ShardUpdate, result: ShardUpdateResult, generation: str) -> None:
        """The worker's files become the shards' content: their index records, the shard rows and
        the step in one lineage transaction (``_record``); then the update's staged parts go."""
        self._record(entry, result, generation)
        remove(step_staging(self.ctx.root, result.key), recursive=True, missing_ok=True)

    def _record(self, entry: ShardUpdate, result: ShardUpdateResult, generation: str) -> None:
        """The index records, the shard rows of ``result`` and its step, in one lineage transaction."""
        ctx, store, key = self.ctx, self.ctx.store, result.key
        indexes = index_steps((written.index_uri, written.index_record) for written in result.written)
        if entry.kind is UpdateKind.EMBED:
            new, = result.written
            ctx.say(f"{key}: shard {entry.shard} holds {new.n_items} items of {generation}")
            store.assign_shard(ctx.name, entry.shard, generation, new.embeddings_uri, new.index_uri, new.sha256,
                               new.n_items, step=key,
                               step_outputs={"shard": entry.shard, "items": new.n_items,
                                             "embeddings_uri": new.embeddings_uri, "index_uri": new.index_uri,
                                             "sha256": new.sha256, "node": result.timing.get("node"),
                                             "seconds": _seconds(result)}, with_steps=indexes)
            return
        kept, new = result.written
        ctx.say(f"{key}: {new.n_items} items of shard {entry.shard} re-embedded into new shard {entry.target}, "
                f"{kept.n_items} stay with {kept.generation}")
        store.assign_shards(
            ctx.name,
            [ShardAssignment(entry.shard, kept.generation, kept.embeddings_uri, kept.index_uri, kept.sha256,
                             n_items=kept.n_items),
             ShardAssignment(entry.target, generation, new.embeddings_uri, new.index_uri, new.sha256,
                             n_items=new.n_items, backfilled_from=kept.generation)],
            grow=True, step=key, with_steps=indexes,
            step_outputs={"source": entry.shard, "target": entry.target, "items": new.n_items, "kept": kept.n_items,
                          "embeddings_uri": new.embeddings_uri, "sha256": new.sha256,
                          "node": result.timing.get("node"), "seconds": _seconds(result)})


def _seconds(result: ShardUpdateResult) -> float | None:
    started, finished = result.timing.get("started"), result.timing.get("finished")
    return None if started is None or finished is None else round(finished - started, 3)

