"""The gallery side of the pipeline: embed, backfill and evaluate the served gallery.

For every served generation, in order:

1. ``plan:<gallery>:<gen>``: freeze what this generation does to the gallery (``gallery_plan``):
   the first served generation embeds every shard (contiguous row ranges of the source); later
   ones follow their backfill policy, with priorities computed per shard on Ray and the exact
   gallery-wide selection of ``orchestrator.backfill.selection`` (selection files per shard).
1b. ``gate:<gallery>:<gen>`` (when another generation serves): what the deployment gate checks
   (``pipeline.gate``), measured before any shard changes; the runner decides and may escalate the
   plan to a full one (``plan:<gallery>:<gen>:full``).
2. ``embed:<gallery>/<shard>:<gen>`` / ``split:<gallery>/<shard>:<gen>``: ONE streamed Ray Data
   pass (``embed_gallery``: read tasks over the gallery source, an actor pool) embeds the items of
   every pending entry; as soon as all items of an entry have arrived, its Parquet file and FAISS
   index are written, then its shard rows move to the new generation in one lineage transaction
   together with the step. The driver holds only the entries in flight (bounded by the read
   concurrency), never the gallery.
   Items arriving twice or never are errors, never silent. A crash leaves each shard wholly old or
   wholly new; the re-run embeds only the entries whose step has not committed.
3. (after deployment) ``gallery-eval:<gallery>:<gen>``: retrieval quality of the served, mixed
   gallery, on a labelled sample (``evaluation.gallery_sample``; skipped without labels): exact (every shard compared along its path) and as the search router serves it
   (through the stored indexes, incompatible shards skipped and listed), next to the same-generation
   baseline (the previous generation on a gallery of its own), the full-backfill number and
   optionally the backfilling curve.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import pyarrow as pa

from orchestrator.backfill import DEFAULT_FRACTIONS, budget_count, compatibility_ranks, write_backfill_curve
from orchestrator.backfill.selection import select_top
from orchestrator.comparison import IncomparableGenerations, comparison_path
from orchestrator.config import BackfillPolicy, PipelineConfig
from orchestrator.data import ImageTensorDataset, LabeledImages, load_source
from orchestrator.data.gallery_sources import GallerySource, MemorySource
from orchestrator.data.registry import STREAMED_SOURCES, open_gallery_source
from orchestrator.distributed.backfill_scores import PriorityRule, ScoredGallery, ShardToScore
from orchestrator.distributed.embed import EmbeddingSettings, embed_gallery, quiet_ray_data
from orchestrator.distributed.gallery_read import EntryRead, RowRange, StoredItems
from orchestrator.gallery import ShardEmbeddings, evaluate_mixed_gallery, read_shard, shard_file_uris, write_shard
from orchestrator.gallery.shard_files import read_selection
from orchestrator.geometry.geometry import Geometry
from orchestrator.index import build_index
from orchestrator.integrity import IntegrityError, load_checked_generation, load_checked_index, record_index, sha256_bytes
from orchestrator.lineage import LineageStore
from orchestrator.lineage.records import ShardAssignment, ShardRecord
from orchestrator.methods.base import embed_dataset_with_ids
from orchestrator.metrics import METRICS
from orchestrator.models.adapters import FORWARD_ADAPTER
from orchestrator.pipeline.gallery_plan import GalleryPlan, PlanEntry, ShardBefore
from orchestrator.pipeline.gate import GateMeasurement
from orchestrator.pipeline.verify import refuse_unknown_file
from orchestrator.progress import Meter
from orchestrator.search import CompatibilityCriterion, IncompatibleShards, SearchRouter
from orchestrator.search.router_evaluation import evaluate_search
from orchestrator.storage import join_uri, read_bytes, write_json_atomic
from orchestrator.storage.locations import StorageRoot

log = logging.getLogger(__name__)


class GalleryUpdater:
    """Plans, executes and evaluates one gallery's updates for a ``PipelineRunner``.

    normalisation: the training split's per-channel (mean, std), shared by every generation.
    eval_images:   the query set of the evaluation (the evaluation split).
    ensure_ray:    called before the first work on Ray (scoring, embedding): connects to or starts
                   the file's Ray then, so that steps with nothing to do on Ray start none. Default:
                   nothing (the caller has connected).
    """

    def __init__(self, config: PipelineConfig, store: LineageStore, storage: str,
                 normalisation: tuple[tuple[float, ...], tuple[float, ...]], eval_images: Callable[[], LabeledImages],
                 say: Callable[[str], None], ensure_ray: Callable[[], None] = lambda: None):
        self.config, self.store, self.say = config, store, say
        self.ensure_ray = ensure_ray
        self.spec = config.gallery
        self.name = config.gallery.name
        self.locations = StorageRoot(storage)  # plan files record locations as the lineage does
        self.root = join_uri(storage, "galleries", self.name)
        self.reports = join_uri(storage, "reports")
        self.mean, self.std = normalisation
        self._eval_images = eval_images
        self._source: GallerySource | None = None
        self._models: dict[str, Any] = {}

    # --- data ----------------------------------------------------------------------------------
    @property
    def source(self) -> GallerySource:
        """The gallery's items: a streamed source (Parquet dataset, image files) read in pieces, or
        an in-memory data source's split; opened once (a listing, no image is read)."""
        if self._source is None:
            kind, options = self.config.gallery_source
            if kind in STREAMED_SOURCES:
                self._source = open_gallery_source(kind, options)
            else:
                source, kwargs = self.config.gallery_loader_kwargs()
                self._source = MemorySource(load_source(source, **kwargs), f"{source}:{self.spec.split}")
        return self._source

    @property
    def image_size(self) -> int:
        if self.config.data.image_size:
            return self.config.data.image_size
        if isinstance(self.source, MemorySource):
            return int(self.source.images.images.shape[1])
        raise ValueError("data.image_size: required with a streamed gallery (the size its images are resized to)")

    def labelled_sample(self, max_items: int) -> LabeledImages | None:
        """A deterministic labelled sample of at most ``max_items`` gallery items (None: no labels)."""
        return self.source.labelled_sample(max_items, self.image_size)

    def _model(self, name: str):
        if name not in self._models:
            self._models[name], _card = load_checked_generation(self.store, self.store.get_generation(name))
            self._models[name].eval()
        return self._models[name]

    def _read(self, shard: ShardRecord) -> ShardEmbeddings:
        return read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)

    # --- 1. plan -------------------------------------------------------------------------------
    def plan_key(self, generation: str) -> str:
        return f"plan:{self.name}:{generation}"

    def escalated_plan_key(self, generation: str) -> str:
        return f"plan:{self.name}:{generation}:full"

    def plan(self, generation, key: str, policy: BackfillPolicy | None = None) -> GalleryPlan:
        """Compute and store the plan of ``generation`` (a ``GenerationSpec``), committing ``key``;
        ``policy`` overrides the generation's backfill policy (the gate's escalation to a full one)."""
        source = self.source
        if not any(g.name == self.name for g in self.store.galleries()):
            self.store.upsert_gallery(self.name, source.description, source.num_items,
                                      self.spec.shard_count(source.num_items))
        shards = self.store.shards(self.name)
        before = tuple(ShardBefore(s.index, s.generation, s.embeddings_uri, s.sha256, s.n_items) for s in shards)
        policy = policy or generation.backfill
        if all(s.generation is None for s in shards):  # first population: every shard, whatever the policy
            bounds = np.cumsum([0] + initial_shard_sizes(source.num_items, len(shards)))
            entries = tuple(PlanEntry("embed", s.index, int(bounds[s.index + 1] - bounds[s.index]),
                                      rows=(int(bounds[s.index]), int(bounds[s.index + 1]))) for s in shards)
            order: tuple[int, ...] = ()
        else:
            if any(s.generation is None for s in shards):
                raise RuntimeError(f"gallery {self.name!r}: shards {[s.index for s in shards if s.generation is None]} "
                                   "were never embedded although others were; the lineage is inconsistent")
            entries, order = self._backfill_entries(generation, policy, shards)
        plan = GalleryPlan(self.name, generation.name, policy.model_dump(mode="json"), entries, before, order)
        uri = join_uri(self.root, "plans", f"{generation.name}{'' if policy is generation.backfill else '.full'}.json")
        refuse_unknown_file(self.store, key, uri)
        write_json_atomic(uri, self.locations.relative_json(plan.to_json()))
        self.store.commit_step(key, {"plan_uri": uri, "entries": len(entries), "items": plan.num_items,
                                     "sha256": sha256_bytes(read_bytes(uri))})
        self.say(f"{key}: {len(entries)} shard update(s), {plan.num_items} of {source.num_items} items "
                 f"({policy.policy}{'' if policy.budget is None else f' {policy.budget:g} of the {policy.budget_unit}'}, "
                 f"order {policy.order})")
        return plan

    def committed_plan(self, generation: str) -> GalleryPlan:
        """The plan ``generation`` executes: the gate's escalated full plan if there is one."""
        outputs = (self.store.committed_outputs(self.escalated_plan_key(generation))
                   or self.store.committed_outputs(self.plan_key(generation)))
        data = read_bytes(outputs["plan_uri"])
        if "sha256" in outputs and sha256_bytes(data) != outputs["sha256"]:
            raise IntegrityError(f"{outputs['plan_uri']}: plan file changed since it was written: sha256 "
                                 f"{sha256_bytes(data)}, the lineage holds {outputs['sha256']}")
        return GalleryPlan.from_json(self.locations.resolve_json(json.loads(data)))

    def _backfill_entries(self, generation, policy: BackfillPolicy,
                          shards: list[ShardRecord]) -> tuple[tuple[PlanEntry, ...], tuple[int, ...]]:
        """The plan's entries from priorities computed on Ray, shard by shard (``ScoredGallery``),
        and the exact gallery-wide selection (``backfill.selection``): the same entries as the
        in-memory ``plan_backfill`` on the same files, without the gallery in the driver."""
        curves = self.config.evaluation.backfill_curves
        if policy.policy == "none" and not curves:
            return (), ()
        candidates = [s for s in shards if s.generation != generation.name]
        self.ensure_ray()
        scored = ScoredGallery(self._priority_rule(generation, policy),
                               [ShardToScore(s.index, s.embeddings_uri, s.sha256) for s in candidates])
        ranked = sorted(scored.summaries, key=lambda x: (-x["mean"], x["index"]))  # shards by mean priority
        order = tuple(int(i) for i in self._curve_order(scored, ranked, policy)) if curves else ()
        if policy.policy == "none":
            return (), order
        if policy.policy == "full" or policy.budget_unit == "shards":
            if policy.policy == "partial":
                ranked = ranked[:budget_count(policy.budget, len(candidates))]
            return tuple(PlanEntry("embed", x["index"], x["n"]) for x in ranked if x["n"]), order
        total = sum(x["n"] for x in scored.summaries)
        threshold, best = select_top(scored.ask(), budget_count(policy.budget, total), total)
        if threshold is None:
            return (), order
        uris = [join_uri(self.root, "plans", f"{generation.name}.selection", f"shard-{s.index:05d}.parquet")
                for s in candidates]
        chosen = scored.write_chosen(threshold, uris)
        picks = sorted((key, position) for position, key in enumerate(best) if key is not None)
        entries, next_index = [], len(shards)
        for _key, position in picks:  # shards in the order of their first pick, as plan_backfill
            count, sha = chosen[position]
            index = candidates[position].index
            if sha is None:
                entries.append(PlanEntry("embed", index, count))
            else:
                entries.append(PlanEntry("split", index, count, selection=(uris[position], sha), target=next_index))
                next_index += 1
        return tuple(entries), order

    def _priority_rule(self, generation, policy: BackfillPolicy) -> PriorityRule:
        order = "random" if policy.policy == "none" else policy.order
        where = f"generation {generation.name!r} backfill.order {order!r}"
        forward, ranks = None, None
        if order == "class_mean_distance":
            record = self.store.get_generation(generation.name)
            if FORWARD_ADAPTER in self._model(generation.name).adapters:
                forward = (record.checkpoint_uri, record.sha256)
        if order == "least_compatible":
            ranks = compatibility_ranks(self._cross_values(generation.name))
        return PriorityRule(order, generation.training.seed, where, forward_model=forward,
                            mapped_generation=generation.parent, generation_ranks=ranks)

    def _cross_values(self, generation: str) -> dict[str, float | None]:
        """Older generation → the recorded M(generation^Q, older^G) on the evaluation split
        (``search.criterion_metric``; None where they have no common distance)."""
        metric, split = self.config.search.criterion_metric, self.config.data.eval_split
        return {r.gallery: r.value for r in self.store.compatibility_values(split)
                if r.query == generation and r.gallery != generation and r.metric == metric}

    @staticmethod
    def _curve_order(scored: ScoredGallery, ranked: list[dict[str, Any]], policy: BackfillPolicy) -> np.ndarray:
        """Every candidate id in the order the policy backfills (the backfilling curve's x-axis):
        whole shards by mean priority for budget_unit ``shards``, else one gallery-wide ranking."""
        parts = scored.all_keys()
        if policy.policy == "partial" and policy.budget_unit == "shards":
            position = {x["index"]: k for k, x in enumerate(scored.summaries)}
            parts = [parts[position[x["index"]]] for x in ranked]
            return np.concatenate([p[np.lexsort((p[:, 1], p[:, 0])), 2] for p in parts]).view(np.int64)
        keys = np.concatenate(parts)
        return keys[np.lexsort((keys[:, 1], keys[:, 0])), 2].view(np.int64)

    # --- 1b. gate ------------------------------------------------------------------------------
    def gate_key(self, generation: str) -> str:
        return f"gate:{self.name}:{generation}"

    def measure_gate(self, plan: GalleryPlan, serving: str, parents: dict[str, str | None]) -> GateMeasurement:
        """What the gate of ``plan.generation`` checks (``pipeline.gate``), before any shard changes:
        the criterion against every older generation the plan leaves in the gallery, and the served
        gallery's mAP after the plan, after a full re-embed and with nothing re-embedded, predicted
        on the ``gallery-eval`` sample, next to the one the serving generation's report measured."""
        generation, split = plan.generation, self.config.data.eval_split
        metric = self.config.search.criterion_metric
        criterion = CompatibilityCriterion.from_records(self.store.compatibility_values(split), metric, split)
        stored = [b for b in plan.before if b.generation not in (None, generation) and b.n_items]
        verdict = {old: criterion.verdict(generation, old) for old in sorted({b.generation for b in stored})}
        replaced = {e.shard for e in plan.entries if e.kind == "embed"}
        remaining = sorted({b.generation for b in stored if b.shard not in replaced})
        verdicts = [[old, verdict[old].admitted, verdict[old].reason] for old in remaining]
        measured = GateMeasurement(generation, serving, metric, verdicts)
        report = self.store.committed_outputs(f"gallery-eval:{self.name}:{serving}")
        if report is None or "mixed" not in report:
            why = (report or {}).get("skipped") or f"{serving}'s served gallery was never scored"
            return dataclasses.replace(measured, unmeasured=why)
        sample = self.labelled_sample(self.config.evaluation.gallery_sample)
        admitted = {generation} | {old for old, v in verdict.items() if v.admitted}
        predicted, full_backfill, no_backfill = self._predicted_quality(plan, sample, admitted, parents)
        return dataclasses.replace(measured, predicted=predicted, serving_quality=float(report["mixed"]["map"]),
                                   full_backfill=full_backfill, no_backfill=no_backfill)

    def _predicted_quality(self, plan: GalleryPlan, sample: LabeledImages, admitted: set[str],
                           parents: dict[str, str | None]) -> tuple[float, float, float]:
        """mAP on ``sample`` of the gallery as ``plan`` leaves it (the planned items embedded by the
        new generation, the others as stored; shards of generations the router would not admit
        are left out, as the router leaves them out), of the gallery fully re-embedded, and of the
        gallery as it is (nothing re-embedded, searched by the new generation's queries)."""
        generation = plan.generation
        full = self._embed_locally(generation, sample)
        shards, moved, unchanged = [], [], []
        for entry_before in plan.before:
            if not entry_before.n_items:
                continue
            stored = read_shard(entry_before.embeddings_uri, expected_sha256=entry_before.sha256).restricted_to(sample.ids)
            if len(stored) and stored.generation in admitted:
                unchanged.append(stored)
            chosen = self._planned_ids(plan, entry_before.shard, stored)
            moved.append(chosen)
            kept = stored.without(chosen)
            if len(kept) and kept.generation in admitted:
                shards.append(kept)
        moved_ids = np.concatenate(moved) if moved else np.zeros(0, dtype=np.int64)
        if moved_ids.size:
            shards.append(full.restricted_to(moved_ids))
        for name in {s.generation for s in shards}:
            self._model(name)
        queries, query_labels, query_ids = self._queries(generation, full)
        models = self._models_for(parents)

        def served(gallery: list[ShardEmbeddings]) -> float:
            if not gallery:
                return 0.0
            return float(evaluate_mixed_gallery(generation, queries, query_labels, query_ids, gallery, models,
                                                parents).mean_ap)

        return served(shards), served([full]), served(unchanged)

    @staticmethod
    def _planned_ids(plan: GalleryPlan, shard: int, stored: ShardEmbeddings) -> np.ndarray:
        """The ids of ``stored`` (shard ``shard`` as the plan found it) that the plan re-embeds."""
        for entry in plan.entries:
            if entry.shard != shard:
                continue
            if entry.kind == "embed":
                return stored.ids
            return np.intersect1d(stored.ids, read_selection(*entry.selection))
        return np.zeros(0, dtype=np.int64)

    # --- 2. execute ----------------------------------------------------------------------------
    def execute(self, plan: GalleryPlan, generation: str, run_step: Callable[[str, Callable[[], None]], None]) -> None:
        """Embed the items of every entry whose step has not committed, in one streamed Ray Data
        pass, and commit each entry as soon as its items are in (``run_step(key, action)`` does the
        step bookkeeping around ``action``). The driver holds only the entries in flight."""
        pending = [e for e in plan.entries if self.store.step_status(e.step_key(self.name, generation)) != "committed"]
        skipped = len(plan.entries) - len(pending)
        if skipped:
            self.say(f"{self.name}: {skipped} shard update(s) of {generation} already committed, skipped")
        if not pending:
            return
        record = self.store.get_generation(generation)
        for entry in pending:
            if entry.kind == "embed" and plan.before[entry.shard].generation is not None:
                self.store.start_backfill(self.name, entry.shard, generation, items=entry.num_items)
        settings = EmbeddingSettings(**self.spec.embedding.model_dump())
        self.ensure_ray()
        quiet_ray_data()
        total = sum(e.num_items for e in pending)
        self.say(f"{self.name}: embedding {total} items of {len(pending)} shard update(s) with {generation} "
                 f"({settings.concurrency} actor(s), batch {settings.batch_size})")
        dataset = embed_gallery(self.source, [self._entry_read(k, e, plan) for k, e in enumerate(pending)],
                                record.checkpoint_uri, record.sha256, generation, self.image_size, self.mean, self.std,
                                settings)
        received: dict[int, list[dict[str, np.ndarray]]] = {k: [] for k in range(len(pending))}
        counts = np.zeros(len(pending), dtype=np.int64)
        model = self._model(generation)
        geometry = Geometry(model.space, model.curv)
        with Meter(self.say, f"{self.name}: embedded", total, "items") as meter:
            for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
                self._receive(batch, pending, received, counts, generation, geometry, run_step)
                meter.advance(len(batch["entry"]))
        incomplete = [pending[k].step_key(self.name, generation) for k in received]
        if incomplete:
            raise RuntimeError(f"{self.name}: the embedding pass ended without all items of {', '.join(incomplete)}")

    def _receive(self, batch: dict[str, np.ndarray], pending: list[PlanEntry],
                 received: dict[int, list[dict[str, np.ndarray]]], counts: np.ndarray, generation: str,
                 geometry: Geometry, run_step: Callable[[str, Callable[[], None]], None]) -> None:
        """File one embedded batch's rows under their shard updates; commit each update whose items
        are all in (and forget its rows)."""
        entry_of = np.asarray(batch["entry"], dtype=np.int64)
        for k in np.unique(entry_of).tolist():
            part = {name: np.asarray(values)[entry_of == k] for name, values in batch.items()}
            if k not in received:
                raise RuntimeError(f"{self.name}: rows of shard update {k} arrived after it was committed")
            received[k].append(part)
            counts[k] += len(part["id"])
            entry = pending[k]
            if counts[k] == entry.num_items:
                shard = _assemble(entry, received.pop(k), generation, geometry, self.source.metadata_columns)
                key = entry.step_key(self.name, generation)
                run_step(key, lambda entry=entry, shard=shard, key=key: self._commit(entry, shard, key))

    @staticmethod
    def _entry_read(position: int, entry: PlanEntry, plan: GalleryPlan) -> EntryRead:
        if entry.rows is not None:
            return RowRange(position, *entry.rows)
        before = plan.before[entry.shard]
        return StoredItems(position, before.embeddings_uri, before.sha256, entry.selection, entry.num_items)

    def _write(self, index: int, shard: ShardEmbeddings, key: str) -> tuple[str, str, str]:
        """Write a shard's Parquet file and FAISS index (never over files the lineage does not
        know), hash the index into the lineage; returns (embeddings URI, index URI, sha256)."""
        embeddings_uri, index_uri = shard_file_uris(self.root, index, shard.generation, shard.ids)
        for uri in (embeddings_uri, index_uri):
            refuse_unknown_file(self.store, key, uri)
        digest = write_shard(embeddings_uri, shard)
        build_index(shard.embeddings, shard.space, self.spec.index, shard.ids, curv=shard.curv,
                    **self.spec.index_options).save(index_uri)
        record_index(self.store, index_uri, shard.ids)
        return embeddings_uri, index_uri, digest

    def _commit(self, entry: PlanEntry, shard: ShardEmbeddings, key: str) -> None:
        generation = shard.generation
        if entry.kind == "embed":
            uri, index_uri, digest = self._write(entry.shard, shard, key)
            self.say(f"{key}: shard {entry.shard} holds {len(shard)} items of {generation}")
            self.store.assign_shard(self.name, entry.shard, generation, uri, index_uri, digest, len(shard), step=key,
                                    step_outputs={"shard": entry.shard, "items": len(shard), "embeddings_uri": uri,
                                                  "index_uri": index_uri, "sha256": digest})
            return
        source_record = self.store.shards(self.name)[entry.shard]
        source = self._read(source_record)
        remaining = source.without(shard.ids)
        if len(remaining) != len(source) - len(shard):
            raise RuntimeError(f"{key}: shard {entry.shard} does not hold all the items the plan moves")
        kept = self._write(entry.shard, remaining, key)
        moved = self._write(entry.target, shard, key)
        self.say(f"{key}: {len(shard)} items of shard {entry.shard} re-embedded into new shard {entry.target}, "
                 f"{len(remaining)} stay with {source.generation}")
        self.store.assign_shards(
            self.name,
            [ShardAssignment(entry.shard, source.generation, *kept, n_items=len(remaining)),
             ShardAssignment(entry.target, generation, *moved, n_items=len(shard), backfilled_from=source.generation)],
            grow=True, step=key,
            step_outputs={"source": entry.shard, "target": entry.target, "items": len(shard),
                          "kept": len(remaining), "embeddings_uri": moved[0], "sha256": moved[2]})

    # --- 3. evaluate ---------------------------------------------------------------------------
    def evaluate(self, generation: str, parents: dict[str, str | None]) -> dict[str, Any]:
        """Quality of the served gallery for ``generation``'s queries (mixed, as stored), of a full
        backfill (every item by ``generation``), and, if configured, the backfilling curve; over a
        labelled sample of at most ``evaluation.gallery_sample`` items (the whole gallery when it is
        smaller). A gallery without labels cannot be scored: the outputs then say so (``skipped``).

        The search row (the router's real top-k through the stored indexes) ranks every stored
        item, so it needs every item's label: it is measured only when the sample is the gallery."""
        total = self.source.num_items
        sample = self.labelled_sample(self.config.evaluation.gallery_sample)
        if sample is None:
            reason = f"the gallery ({self.source.description}) has no labels"
            self.say(f"gallery-eval {self.name} as {generation}: skipped: {reason}")
            return {"serving": generation, "skipped": reason, "gallery_items": total}
        whole = len(sample) == total
        if not whole:
            self.say(f"gallery-eval {self.name} as {generation}: a labelled sample of {len(sample)} of {total} items")
        shards = [s for s in self.store.shards(self.name) if s.n_items]
        stored = [part for part in (self._read(s).restricted_to(sample.ids) for s in shards) if len(part)]
        for name in {s.generation for s in stored} | {generation}:
            self._model(name)
        full_shard = self._embed_locally(generation, sample)
        queries, query_labels, query_ids = self._queries(generation, full_shard)
        models = self._models_for(parents)
        stored, incomparable = self._comparable(generation, stored, models, parents)
        if not stored:  # nothing the serving generation can search: every query retrieves nothing
            raise RuntimeError(f"gallery-eval {self.name} as {generation}: no stored item can be compared with "
                               f"{generation}'s queries ({'; '.join(incomparable.values())})")
        mixed = evaluate_mixed_gallery(generation, queries, query_labels, query_ids, stored, models, parents)
        full = evaluate_mixed_gallery(generation, queries, query_labels, query_ids, [full_shard], models, parents)
        search = (self._search_quality(generation, sample, queries, query_labels, query_ids, models, parents, shards)
                  if whole else {**{m: None for m in METRICS}, "k": self.config.search.eval_k, "searched_items": 0,
                                 "gallery_items": total, "skipped": "measured on the whole gallery only", "paths": {}})
        outputs: dict[str, Any] = {"serving": generation, "mixed": mixed.as_row(), "full_backfill": full.as_row(),
                                   "items_by_generation": mixed.items_by_generation, "search": search,
                                   "evaluated_items": len(sample), "gallery_items": total,
                                   "not_compared": incomparable,
                                   "same_generation": self._previous_full_backfill(generation)}
        plan = self.committed_plan(generation)
        if self.config.evaluation.backfill_curves and whole and any(b.generation for b in plan.before):
            outputs["curve"] = self._curve(plan, full_shard, queries, query_labels, query_ids, models, parents)
        return outputs

    def _comparable(self, generation: str, shards: list[ShardEmbeddings], models: dict[str, Any],
                    parents: dict[str, str | None]) -> tuple[list[ShardEmbeddings], dict[str, str]]:
        """The shards ``generation``'s queries can be compared with, and, per generation left out,
        why (no common distance: its items cannot be searched, as the router leaves them out)."""
        reasons: dict[str, str] = {}
        for name in {s.generation for s in shards}:
            try:
                comparison_path(generation, name, models, parents)
            except IncomparableGenerations as refused:
                reasons[name] = refused.reason
                self.say(f"gallery-eval {self.name} as {generation}: {name}'s items left out: {refused.reason}")
        return [s for s in shards if s.generation not in reasons], reasons

    def _search_quality(self, generation: str, gallery: LabeledImages, queries: torch.Tensor, query_labels: np.ndarray,
                        query_ids: np.ndarray | None, models: dict[str, Any], parents: dict[str, str | None],
                        shards: list[ShardRecord]) -> dict[str, Any]:
        """What serving actually returns: the router over the shards' stored indexes, older shards
        admitted by the compatibility criterion (refused ones skipped and listed), top-k merged."""
        criterion = CompatibilityCriterion.from_records(
            self.store.compatibility_values(self.config.data.eval_split), self.config.search.criterion_metric,
            self.config.data.eval_split)
        by_uri = {s.index_uri: s for s in shards}
        try:
            router = SearchRouter(generation, models, parents, shards, criterion,
                                  lambda uri: load_checked_index(self.store, by_uri[uri]), on_incompatible="skip",
                                  read_embeddings=self._read)
        except IncompatibleShards as refused:  # not one shard is searchable: report that, do not fail the step
            self.say(f"search {self.name} as {generation}: nothing searchable: {refused}")
            return {**{m: None for m in METRICS}, "k": self.config.search.eval_k or len(gallery),
                    "searched_items": 0, "gallery_items": len(gallery),
                    "skipped": "; ".join(s.describe() for s in refused.shards), "paths": {}}
        for skipped in router.skipped:
            self.say(f"search {self.name} as {generation}: not searched: {skipped.describe()}")
        evaluation = evaluate_search(router, queries, query_labels, gallery.ids, gallery.labels,
                                     self.config.search.eval_k, query_ids)
        return {**evaluation.as_row(), "paths": router.paths()}

    def _previous_full_backfill(self, generation: str) -> dict[str, Any] | None:
        """The same-generation baseline: the previous served generation on a gallery wholly its
        own (its full-backfill row), i.e. what serving gave before this update; None for the first."""
        served = [g.name for g in self.config.served_generations]
        position = served.index(generation)
        if position == 0:
            return None
        outputs = self.store.committed_outputs(f"gallery-eval:{self.name}:{served[position - 1]}")
        if outputs is None or "full_backfill" not in outputs:
            return None
        return {"generation": served[position - 1], **outputs["full_backfill"]}

    def _models_for(self, parents: dict[str, str | None]) -> dict[str, Any]:
        """Every loaded model plus their ancestors (an adapter path may pass through them)."""
        for name in list(self._models):
            ancestor = parents.get(name)
            while ancestor is not None:
                self._model(ancestor)
                ancestor = parents.get(ancestor)
        return dict(self._models)

    def _queries(self, generation: str, gallery: ShardEmbeddings) -> tuple[torch.Tensor, np.ndarray, np.ndarray | None]:
        """The evaluation split embedded by ``generation``, with ids for leave-one-out when the
        queries are the gallery's own items (same source and split): then they are ``gallery``,
        the gallery ``generation`` just embedded, not embedded a second time."""
        if self.config.gallery.source is None and self.spec.split == self.config.data.eval_split:
            return torch.from_numpy(gallery.embeddings), gallery.labels, gallery.ids
        images = self._eval_images()
        size = self.config.data.image_size or int(images.images.shape[1])
        out, labels, _ids = embed_dataset_with_ids(self._model(generation), ImageTensorDataset(images, size, self.mean, self.std))
        return out.embedding, labels.numpy(), None

    def _embed_locally(self, generation: str, items: LabeledImages) -> ShardEmbeddings:
        """``items`` (the evaluation's labelled sample) embedded by ``generation`` in this process."""
        model = self._model(generation)
        out, labels, ids = embed_dataset_with_ids(model, ImageTensorDataset(items, self.image_size, self.mean, self.std))
        geometry = Geometry(model.space, model.curv)
        return ShardEmbeddings(ids.numpy(), labels.numpy(), out.embedding.numpy().astype(np.float32),
                               geometry.uncertainty(out.embedding).numpy().astype(np.float32), generation,
                               geometry.space.value, geometry.curv)

    def _curve(self, plan: GalleryPlan, full: ShardEmbeddings, queries, query_labels, query_ids, models,
               parents) -> dict[str, Any]:
        """mAP of the served gallery when the first ⌊β·N⌋ items of the plan's priority order hold
        the new generation and the rest what they held before the plan (λ-orth §2.11)."""
        before = [read_shard(b.embeddings_uri, expected_sha256=b.sha256) for b in plan.before if b.n_items]
        order = plan.order_array()
        points = []
        for beta in DEFAULT_FRACTIONS:
            moved = order[:budget_count(beta, len(order))]
            shards = [s.without(moved) for s in before]
            shards = [s for s in shards if len(s)]
            if moved.size:
                shards.append(full.take(np.flatnonzero(np.isin(full.ids, moved))))
            result = evaluate_mixed_gallery(plan.generation, queries, query_labels, query_ids, shards, models, parents)
            points.append((beta, result.mean_ap))
        files = write_backfill_curve(join_uri(self.reports, f"backfill-{self.name}-{plan.generation}"), points,
                                     metric="map", title=f"{plan.generation}: {plan.policy['order']} order")
        return {"points": points, **files, "order": plan.policy["order"]}


def initial_shard_sizes(num_items: int, num_shards: int) -> list[int]:
    """The sizes of the initial shards: contiguous row blocks differing by at most one, larger
    first (``numpy.array_split``; over rows sorted by id this is ``gallery.layout``'s id blocks)."""
    if num_items < num_shards:
        raise ValueError(f"{num_items} items cannot fill {num_shards} shards")
    return [num_items // num_shards + (1 if k < num_items % num_shards else 0) for k in range(num_shards)]


def _assemble(entry: PlanEntry, parts: list[dict[str, np.ndarray]], generation: str, geometry: Geometry,
              metadata_columns: tuple[str, ...]) -> ShardEmbeddings:
    """One shard update's rows (in arrival order) → its ``ShardEmbeddings``, sorted by id; the
    rows must be exactly the planned ones (unique, and the planned range when there is one)."""
    column = lambda name: np.concatenate([p[name] for p in parts])  # noqa: E731
    ids, rows = column("id").astype(np.int64), column("row").astype(np.int64)
    planned = entry.rows is None or np.array_equal(np.sort(rows), np.arange(*entry.rows))
    if np.unique(ids).size != ids.size or not planned:
        raise RuntimeError(f"shard {entry.shard} of {generation}: the embedded items are not exactly the planned "
                           f"ones ({ids.size} rows, {np.unique(ids).size} distinct ids, {entry.num_items} planned)")
    attributes = pa.table({"uri": pa.array(column("uri").tolist(), type=pa.string()),
                           **{name: pa.array(column(name).tolist()) for name in metadata_columns}})
    embeddings = np.stack(column("embedding")) if column("embedding").dtype == object else column("embedding")
    return ShardEmbeddings(ids, column("label").astype(np.int64), embeddings.astype(np.float32),
                           column("uncertainty").astype(np.float32), generation, geometry.space.value, geometry.curv, rows,
                           attributes).sorted_by_id()
