"""The gallery side of the pipeline: embed, backfill and evaluate the served gallery.

For every served generation, in order:

1. ``plan:<gallery>:<gen>``: freeze what this generation does to the gallery (``gallery_plan``):
   the first served generation embeds every shard; later ones follow their backfill policy
   (``orchestrator.backfill.plan_backfill`` on priorities read from the shard files).
2. ``embed:<gallery>/<shard>:<gen>`` / ``split:<gallery>/<shard>:<gen>``: ONE Ray Data pass
   (``embed_with_ray_data``, an actor pool) embeds the items of every pending entry; as soon as
   all items of an entry have arrived, its Parquet file and FAISS index are written, then its
   shard rows move to the new generation in one lineage transaction together with the step.
   Items arriving twice or never are errors, never silent. A crash leaves each shard wholly old or
   wholly new; the re-run embeds only the entries whose step has not committed.
3. (after deployment) ``gallery-eval:<gallery>:<gen>``: retrieval quality of the served, mixed
   gallery: exact (every shard compared along its path) and as the search router serves it
   (through the stored indexes, incompatible shards skipped and listed), next to the same-generation
   baseline (the previous generation on a gallery of its own), the full-backfill number and
   optionally the backfilling curve.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from orchestrator.backfill import (
    DEFAULT_FRACTIONS,
    ShardInfo,
    budget_count,
    class_mean_distance_priority,
    plan_backfill,
    priority_order,
    random_priority,
    write_backfill_curve,
)
from orchestrator.config import BackfillPolicy, PipelineConfig
from orchestrator.data import ImageTensorDataset, LabeledImages, load_source
from orchestrator.distributed.embed import EmbeddingSettings, embed_with_ray_data, quiet_ray_data
from orchestrator.gallery import ShardEmbeddings, evaluate_mixed_gallery, read_shard, shard_file_uris, shard_members, write_shard
from orchestrator.geometry import lorentz
from orchestrator.geometry.spaces import Space
from orchestrator.index import build_index, load_index
from orchestrator.lineage import LineageStore
from orchestrator.lineage.records import ShardAssignment, ShardRecord
from orchestrator.methods.base import embed_dataset_with_ids
from orchestrator.metrics import METRICS
from orchestrator.models.adapters import FORWARD_ADAPTER
from orchestrator.pipeline.gallery_plan import GalleryPlan, PlanEntry, ShardBefore
from orchestrator.search import CompatibilityCriterion, IncompatibleShards, SearchRouter
from orchestrator.search.evaluation import evaluate_search
from orchestrator.storage import join_uri, load_generation, read_json, write_json_atomic

log = logging.getLogger(__name__)


class GalleryUpdater:
    """Plans, executes and evaluates one gallery's updates for a ``PipelineRunner``.

    normalisation: the training split's per-channel (mean, std), shared by every generation.
    eval_images:   the query set of the evaluation (the evaluation split).
    """

    def __init__(self, config: PipelineConfig, store: LineageStore, storage: str,
                 normalisation: tuple[tuple[float, ...], tuple[float, ...]], eval_images: Callable[[], LabeledImages],
                 say: Callable[[str], None]):
        self.config, self.store, self.say = config, store, say
        self.spec = config.gallery
        self.name = config.gallery.name
        self.root = join_uri(storage, "galleries", self.name)
        self.reports = join_uri(storage, "reports")
        self.mean, self.std = normalisation
        self._eval_images = eval_images
        self._images: LabeledImages | None = None
        self._models: dict[str, Any] = {}

    # --- data ----------------------------------------------------------------------------------
    @property
    def images(self) -> LabeledImages:
        """The gallery's items (ids unique), loaded once."""
        if self._images is None:
            source, kwargs = self.config.gallery_loader_kwargs()
            images = load_source(source, **kwargs)
            if np.unique(images.ids).size != len(images):
                raise ValueError(f"gallery {self.name!r}: source {source!r} split {self.spec.split!r} has duplicate item ids")
            self._images = images
        return self._images

    @property
    def image_size(self) -> int:
        return self.config.data.image_size or int(self.images.images.shape[1])

    def _positions(self, item_ids: np.ndarray) -> np.ndarray:
        positions = _index_of(self.images.ids, item_ids)
        if (positions < 0).any():
            raise ValueError(f"gallery {self.name!r}: items {item_ids[positions < 0][:5].tolist()} are not in the source")
        return positions

    def _model(self, name: str):
        if name not in self._models:
            record = self.store.get_generation(name)
            self._models[name], _card = load_generation(record.checkpoint_uri, expected_sha256=record.sha256)
            self._models[name].eval()
        return self._models[name]

    def _read(self, shard: ShardRecord) -> ShardEmbeddings:
        return read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)

    # --- 1. plan -------------------------------------------------------------------------------
    def plan_key(self, generation: str) -> str:
        return f"plan:{self.name}:{generation}"

    def plan(self, generation, key: str) -> GalleryPlan:
        """Compute and store the plan of ``generation`` (a ``GenerationSpec``), committing ``key``."""
        if not any(g.name == self.name for g in self.store.galleries()):
            self.store.upsert_gallery(self.name, f"{self.config.gallery_source[0]}:{self.spec.split}",
                                      len(self.images), self.spec.num_shards)
        shards = self.store.shards(self.name)
        before = tuple(ShardBefore(s.index, s.generation, s.embeddings_uri, s.sha256, s.n_items) for s in shards)
        policy = generation.backfill
        if all(s.generation is None for s in shards):  # first population: every shard, whatever the policy
            members = shard_members(self.images.ids, len(shards))
            entries = tuple(PlanEntry("embed", s.index, tuple(int(i) for i in members[s.index])) for s in shards)
            order: tuple[int, ...] = tuple(int(i) for i in np.sort(self.images.ids))
        else:
            if any(s.generation is None for s in shards):
                raise RuntimeError(f"gallery {self.name!r}: shards {[s.index for s in shards if s.generation is None]} "
                                   "were never embedded although others were; the lineage is inconsistent")
            entries, order = self._backfill_entries(generation, shards)
        plan = GalleryPlan(self.name, generation.name, policy.model_dump(mode="json"), entries, before, order)
        uri = join_uri(self.root, "plans", f"{generation.name}.json")
        write_json_atomic(uri, plan.to_json())
        self.store.commit_step(key, {"plan_uri": uri, "entries": len(entries), "items": plan.num_items})
        self.say(f"{key}: {len(entries)} shard update(s), {plan.num_items} of {len(self.images)} items "
                 f"({policy.policy}{'' if policy.budget is None else f' {policy.budget:g} of the {policy.budget_unit}'}, "
                 f"order {policy.order})")
        return plan

    def committed_plan(self, generation: str) -> GalleryPlan:
        outputs = self.store.committed_outputs(self.plan_key(generation))
        return GalleryPlan.from_json(read_json(outputs["plan_uri"]))

    def _backfill_entries(self, generation, shards: list[ShardRecord]) -> tuple[tuple[PlanEntry, ...], tuple[int, ...]]:
        policy = generation.backfill
        candidates = [s for s in shards if s.generation != generation.name]
        data = {s.index: self._read(s) for s in candidates}
        scores = self._priorities(generation, data)
        infos = [ShardInfo(i, d.ids, None if scores is None else scores[i]) for i, d in data.items()]
        seed = generation.training.seed
        plan = plan_backfill(policy, infos, seed=seed)
        order = tuple(int(i) for i in _priority_order_of_all_items(policy, infos, seed))
        next_index = len(shards)
        entries = []
        for part in plan.shards:
            if part.whole:
                entries.append(PlanEntry("embed", part.index, tuple(int(i) for i in np.sort(part.item_ids))))
            else:
                entries.append(PlanEntry("split", part.index, tuple(int(i) for i in np.sort(part.item_ids)), next_index))
                next_index += 1
        return tuple(entries), order

    def _priorities(self, generation, data: dict[int, ShardEmbeddings]) -> dict[int, np.ndarray] | None:
        """Per-shard priority scores for the policy's order (None: seeded random, by the planner)."""
        order = generation.backfill.order
        where = f"generation {generation.name!r} backfill.order {order!r}"
        if generation.backfill.policy == "none" or order == "random":
            return None
        if order == "uncertainty":
            for index, shard in data.items():
                if shard.space != "lorentz":
                    raise ValueError(f"{where}: needs hyperbolic (Lorentz) embeddings, but shard {index} holds "
                                     f"generation {shard.generation!r} in space {shard.space!r}")
            return {index: shard.uncertainty.astype(np.float64) for index, shard in data.items()}
        # class_mean_distance: F(h_old) for the parent's items when the new model has a forward map
        model = self._model(generation.name)
        features = []
        for index, shard in data.items():
            if (shard.labels < 0).any():
                raise ValueError(f"{where}: needs gallery labels; shard {index} has items without a label")
            vectors = torch.from_numpy(shard.embeddings)
            if FORWARD_ADAPTER in model.adapters and shard.generation == generation.parent:
                with torch.no_grad():
                    vectors = model.adapters[FORWARD_ADAPTER](vectors)
            features.append(vectors)
        widths = {f.shape[1] for f in features}
        if len(widths) > 1:
            raise ValueError(f"{where}: the candidate shards' embeddings have different widths {sorted(widths)}; "
                             "class means need one space (use order 'random' or 'uncertainty')")
        distances = class_mean_distance_priority(torch.cat(features), np.concatenate([d.labels for d in data.values()]))
        bounds = np.cumsum([0] + [len(d) for d in data.values()])
        return {index: distances[bounds[k]:bounds[k + 1]] for k, index in enumerate(data)}

    # --- 2. execute ----------------------------------------------------------------------------
    def execute(self, plan: GalleryPlan, generation: str, run_step: Callable[[str, Callable[[], None]], None]) -> None:
        """Embed the items of every entry whose step has not committed, in one Ray Data pass, and
        commit each entry as soon as its items are in (``run_step(key, action)`` does the step
        bookkeeping around ``action``)."""
        pending = [e for e in plan.entries if self.store.step_status(e.step_key(self.name, generation)) != "committed"]
        skipped = len(plan.entries) - len(pending)
        if skipped:
            self.say(f"{self.name}: {skipped} shard update(s) of {generation} already committed, skipped")
        if not pending:
            return
        record = self.store.get_generation(generation)
        for entry in pending:
            if entry.kind == "embed" and plan.before[entry.shard].generation is not None:
                self.store.start_backfill(self.name, entry.shard, generation, items=len(entry.item_ids))
        item_ids = np.concatenate([np.asarray(e.item_ids, dtype=np.int64) for e in pending])
        entry_of = np.concatenate([np.full(len(e.item_ids), k) for k, e in enumerate(pending)])
        settings = EmbeddingSettings(**self.spec.embedding.model_dump())
        quiet_ray_data()
        self.say(f"{self.name}: embedding {item_ids.size} items of {len(pending)} shard update(s) with {generation} "
                 f"({settings.concurrency} actor(s), batch {settings.batch_size})")
        dataset = embed_with_ray_data(self.images, record.checkpoint_uri, record.sha256, generation, self.image_size,
                                      self.mean, self.std, settings, positions=self._positions(item_ids))
        received: dict[int, list[dict[str, np.ndarray]]] = {k: [] for k in range(len(pending))}
        counts = np.zeros(len(pending), dtype=np.int64)
        model = self._model(generation)
        for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
            found = _index_of(item_ids, np.asarray(batch["id"], dtype=np.int64))
            rows = np.where(found >= 0, entry_of[found], -1)
            if (rows < 0).any():
                raise RuntimeError(f"{self.name}: the embedding returned items {batch['id'][rows < 0][:5].tolist()} "
                                   "that no pending entry asked for")
            for k in np.unique(rows):
                part = {name: np.asarray(values)[rows == k] for name, values in batch.items()}
                received[k].append(part)
                counts[k] += len(part["id"])
                entry = pending[k]
                if counts[k] == len(entry.item_ids):
                    shard = self._assemble(entry, received.pop(k), generation, model.space.value, _curvature(model))
                    key = entry.step_key(self.name, generation)
                    run_step(key, lambda entry=entry, shard=shard, key=key: self._commit(entry, shard, plan, key))
        incomplete = [pending[k].step_key(self.name, generation) for k in received]
        if incomplete:
            raise RuntimeError(f"{self.name}: the embedding pass ended without all items of {', '.join(incomplete)}")

    @staticmethod
    def _assemble(entry: PlanEntry, parts: list[dict[str, np.ndarray]], generation: str, space: str,
                  curv: float) -> ShardEmbeddings:
        ids = np.concatenate([p["id"] for p in parts]).astype(np.int64)
        if np.unique(ids).size != ids.size or set(ids.tolist()) != set(entry.item_ids):
            raise RuntimeError(f"shard {entry.shard} of {generation}: the embedded items are not exactly the "
                               f"planned ones ({ids.size} rows, {np.unique(ids).size} distinct, "
                               f"{len(entry.item_ids)} planned)")
        return ShardEmbeddings(ids, np.concatenate([p["label"] for p in parts]).astype(np.int64),
                               np.concatenate([p["embedding"] for p in parts]).astype(np.float32),
                               np.concatenate([p["uncertainty"] for p in parts]).astype(np.float32),
                               generation, space, curv).sorted_by_id()

    def _write(self, index: int, shard: ShardEmbeddings) -> tuple[str, str, str]:
        """Write a shard's Parquet file and FAISS index; returns (embeddings URI, index URI, sha256)."""
        embeddings_uri, index_uri = shard_file_uris(self.root, index, shard.generation, shard.ids)
        digest = write_shard(embeddings_uri, shard)
        build_index(shard.embeddings, shard.space, self.spec.index, shard.ids, curv=shard.curv,
                    **self.spec.index_options).save(index_uri)
        return embeddings_uri, index_uri, digest

    def _commit(self, entry: PlanEntry, shard: ShardEmbeddings, plan: GalleryPlan, key: str) -> None:
        generation = shard.generation
        if entry.kind == "embed":
            uri, index_uri, digest = self._write(entry.shard, shard)
            self.say(f"{key}: shard {entry.shard} holds {len(shard)} items of {generation}")
            self.store.assign_shard(self.name, entry.shard, generation, uri, index_uri, digest, len(shard), step=key,
                                    step_outputs={"shard": entry.shard, "items": len(shard), "embeddings_uri": uri,
                                                  "index_uri": index_uri, "sha256": digest})
            return
        source_record = self.store.shards(self.name)[entry.shard]
        source = self._read(source_record)
        remaining = source.without(np.asarray(entry.item_ids, dtype=np.int64))
        if len(remaining) != len(source) - len(entry.item_ids):
            raise RuntimeError(f"{key}: shard {entry.shard} does not hold all the items the plan moves")
        kept = self._write(entry.shard, remaining)
        moved = self._write(entry.target, shard)
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
        backfill (every item by ``generation``), and, if configured, the backfilling curve."""
        shards = [s for s in self.store.shards(self.name) if s.n_items]
        stored = [self._read(s) for s in shards]
        for name in {s.generation for s in stored} | {generation}:
            self._model(name)
        full_shard = self._embed_locally(generation)
        queries, query_labels, query_ids = self._queries(generation, full_shard)
        models = self._models_for(parents)
        mixed = evaluate_mixed_gallery(generation, queries, query_labels, query_ids, stored, models, parents)
        full = evaluate_mixed_gallery(generation, queries, query_labels, query_ids, [full_shard], models, parents)
        outputs: dict[str, Any] = {"serving": generation, "mixed": mixed.as_row(), "full_backfill": full.as_row(),
                                   "items_by_generation": mixed.items_by_generation,
                                   "search": self._search_quality(generation, queries, query_labels, query_ids, models,
                                                                  parents, shards),
                                   "same_generation": self._previous_full_backfill(generation)}
        plan = self.committed_plan(generation)
        if self.config.evaluation.backfill_curves and any(b.generation for b in plan.before):
            outputs["curve"] = self._curve(plan, full_shard, queries, query_labels, query_ids, models, parents)
        return outputs

    def _search_quality(self, generation: str, queries: torch.Tensor, query_labels: np.ndarray,
                        query_ids: np.ndarray | None, models: dict[str, Any], parents: dict[str, str | None],
                        shards: list[ShardRecord]) -> dict[str, Any]:
        """What serving actually returns: the router over the shards' stored indexes, older shards
        admitted by the compatibility criterion (refused ones skipped and listed), top-k merged."""
        criterion = CompatibilityCriterion.from_records(
            self.store.compatibility_values(self.config.data.eval_split), self.config.search.criterion_metric,
            self.config.data.eval_split)
        try:
            router = SearchRouter(generation, models, parents, shards, criterion, load_index, on_incompatible="skip",
                                  read_embeddings=self._read)
        except IncompatibleShards as refused:  # not one shard is searchable: report that, do not fail the step
            self.say(f"search {self.name} as {generation}: nothing searchable: {refused}")
            return {**{m: None for m in METRICS}, "k": self.config.search.eval_k or len(self.images),
                    "searched_items": 0, "gallery_items": len(self.images),
                    "skipped": "; ".join(s.describe() for s in refused.shards), "paths": {}}
        for skipped in router.skipped:
            self.say(f"search {self.name} as {generation}: not searched: {skipped.describe()}")
        evaluation = evaluate_search(router, queries, query_labels, self.images.ids, self.images.labels,
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
        return None if outputs is None else {"generation": served[position - 1], **outputs["full_backfill"]}

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

    def _embed_locally(self, generation: str) -> ShardEmbeddings:
        """Every gallery item embedded by ``generation`` in this process (evaluation only)."""
        model = self._model(generation)
        out, labels, ids = embed_dataset_with_ids(model, ImageTensorDataset(self.images, self.image_size, self.mean, self.std))
        uncertainty = (lorentz.uncertainty(out.embedding, model.curv).numpy() if model.space is Space.LORENTZ
                       else np.full(len(ids), np.nan))
        return ShardEmbeddings(ids.numpy(), labels.numpy(), out.embedding.numpy().astype(np.float32),
                               uncertainty.astype(np.float32), generation, model.space.value, _curvature(model))

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


def _index_of(haystack: np.ndarray, needles: np.ndarray) -> np.ndarray:
    """Position in ``haystack`` (N,) unique ids of each of ``needles`` (M,), −1 where absent
    (vectorised: a sort of the haystack and a binary search per needle)."""
    order = np.argsort(haystack, kind="stable")
    found = order[np.clip(np.searchsorted(haystack, needles, sorter=order), 0, len(order) - 1)]
    return np.where(haystack[found] == needles, found, -1)


def _curvature(model) -> float:
    """The curvature magnitude shard files record: the model's for hyperbolic spaces, 1 (unused)
    for flat ones, whose lift reports 0."""
    return model.curv if model.space in (Space.LORENTZ, Space.POINCARE) else 1.0


def _priority_order_of_all_items(policy: BackfillPolicy, infos: list[ShardInfo], seed: int) -> np.ndarray:
    """Every candidate item id in the order the policy backfills (the x-axis of the backfilling
    curve): whole shards by mean priority for budget_unit ``shards``, else one gallery-wide
    item ranking (policy ``none`` / order ``random``: the seeded random order)."""
    if policy.policy == "partial" and policy.budget_unit == "shards":
        whole = plan_backfill(BackfillPolicy(policy="full", order=policy.order), infos, seed=seed)
        return whole.item_ids
    ids = np.concatenate([info.item_ids for info in infos]).astype(np.int64)
    if any(info.scores is None for info in infos):
        scores = random_priority(ids, seed)
    else:
        scores = np.concatenate([info.scores for info in infos])
    return ids[priority_order(scores, ids)]
