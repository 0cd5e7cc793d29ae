"""Scoring the served gallery after a generation's deployment (``gallery-eval:<gallery>:<gen>``):
retrieval quality of the mixed gallery on a labelled sample (``evaluation.gallery_sample``;
skipped without labels), exact (every shard compared along its path) and as the search router
serves it (through the stored indexes, incompatible shards skipped and listed), next to the
same-generation baseline, the full-backfill number and optionally the backfilling curve."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from orchestrator.backfill import DEFAULT_FRACTIONS, budget_count, write_backfill_curve
from orchestrator.data import LabeledImages
from orchestrator.gallery import ShardEmbeddings, comparable_shards, evaluate_mixed_gallery, read_recorded_shard
from orchestrator.lineage.records import ShardRecord
from orchestrator.lineage.step_keys import gallery_eval_key
from orchestrator.metrics import METRICS
from orchestrator.pipeline.gallery.context import GalleryContext
from orchestrator.pipeline.gallery.plan import GalleryPlan
from orchestrator.pipeline.gallery.planner import GalleryPlanner
from orchestrator.search import CompatibilityCriterion, IncompatibleShards, SearchRouter
from orchestrator.search.router_evaluation import evaluate_search
from orchestrator.storage import join_uri
from orchestrator.stores import load_checked_shard, read_checked_embeddings


class GalleryEvaluator:
    """Scores the served gallery of each deployed generation (module docstring)."""

    def __init__(self, ctx: GalleryContext, planner: GalleryPlanner):
        self.ctx, self.planner = ctx, planner

    def evaluate(self, generation: str, parents: dict[str, str | None]) -> dict[str, Any]:
        """Quality of the served gallery for ``generation``'s queries (mixed, as stored), of a full
        backfill (every item by ``generation``), and, if configured, the backfilling curve; over a
        labelled sample of at most ``evaluation.gallery_sample`` items (the whole gallery when it is
        smaller). A gallery without labels cannot be scored: the outputs then say so (``skipped``).

        The search row (the router's real top-k through the stored indexes) ranks every stored
        item, so it needs every item's label: it is measured only when the sample is the gallery."""
        total = self.ctx.source.num_items
        sample = self.ctx.labelled_sample(self.ctx.config.evaluation.gallery_sample)
        if sample is None:
            reason = f"the gallery ({self.ctx.source.description}) has no labels"
            self.ctx.say(f"gallery-eval {self.ctx.name} as {generation}: skipped: {reason}")
            return {"serving": generation, "skipped": reason, "gallery_items": total}
        whole = len(sample) == total
        if not whole:
            self.ctx.say(f"gallery-eval {self.ctx.name} as {generation}: a labelled sample of {len(sample)} of {total} items")
        shards = [s for s in self.ctx.store.shards(self.ctx.name) if s.n_items]
        stored = [part for part in (read_recorded_shard(s).restricted_to(sample.ids) for s in shards) if len(part)]
        for name in {s.generation for s in stored} | {generation}:
            self.ctx.model(name)
        full_shard = self.ctx.embed_locally(generation, sample)
        queries, query_labels, query_ids = self.ctx.queries(generation, full_shard)
        others = self.ctx.other_queries(generation, sample, parents)
        models = self.ctx.models_for(parents)
        stored, incomparable = self._comparable(generation, stored, models, parents)
        if not stored:  # nothing the serving generation can search: every query retrieves nothing
            raise RuntimeError(f"gallery-eval {self.ctx.name} as {generation}: no stored item can be compared with "
                               f"{generation}'s queries ({'; '.join(incomparable.values())})")
        mixed = evaluate_mixed_gallery(generation, queries, query_labels, query_ids, stored, models, parents,
                                       queries_by_generation=others)
        full = evaluate_mixed_gallery(generation, queries, query_labels, query_ids, [full_shard], models, parents,
                                      queries_by_generation=others)
        search = (self._search_quality(generation, sample, queries, query_labels, query_ids, models, parents, shards,
                                       others)
                  if whole else {**{m: None for m in METRICS}, "k": self.ctx.config.search.eval_k, "searched_items": 0,
                                 "gallery_items": total, "skipped": "measured on the whole gallery only", "paths": {}})
        outputs: dict[str, Any] = {"serving": generation, "mixed": mixed.as_row(), "full_backfill": full.as_row(),
                                   "items_by_generation": mixed.items_by_generation, "search": search,
                                   "evaluated_items": len(sample), "gallery_items": total,
                                   "not_compared": incomparable,
                                   "same_generation": self._previous_full_backfill(generation)}
        plan = self.planner.committed_plan(generation)
        if self.ctx.config.evaluation.backfill_curves and whole and any(b.generation for b in plan.before):
            outputs["curve"] = self._curve(plan, full_shard, queries, query_labels, query_ids, models, parents, others)
        return outputs

    def _comparable(self, generation: str, shards: list[ShardEmbeddings], models: dict[str, Any],
                    parents: dict[str, str | None]) -> tuple[list[ShardEmbeddings], dict[str, str]]:
        """``comparable_shards``, each generation left out said in the run's log."""
        kept, reasons = comparable_shards(generation, shards, models, parents)
        for name, reason in reasons.items():
            self.ctx.say(f"gallery-eval {self.ctx.name} as {generation}: {name}'s items left out: {reason}")
        return kept, reasons

    def _search_quality(self, generation: str, gallery: LabeledImages, queries: torch.Tensor, query_labels: np.ndarray,
                        query_ids: np.ndarray | None, models: dict[str, Any], parents: dict[str, str | None],
                        shards: list[ShardRecord], others: dict[str, torch.Tensor]) -> dict[str, Any]:
        """What serving actually returns: the router over the shards' stored indexes, older shards
        admitted by the compatibility criterion (refused ones skipped and listed), top-k merged."""
        criterion = CompatibilityCriterion.from_records(
            self.ctx.store.compatibility_values(self.ctx.config.data.eval_split), self.ctx.config.search.criterion_metric,
            self.ctx.config.data.eval_split)
        by_uri = {s.index_uri: s for s in shards}
        try:
            router = SearchRouter(generation, models, parents, shards, criterion,
                                  lambda uri: load_checked_shard(self.ctx.store, by_uri[uri]), on_incompatible="skip",
                                  read_embeddings=lambda shard: read_checked_embeddings(self.ctx.store, shard))
        except IncompatibleShards as refused:  # not one shard is searchable: report that, do not fail the step
            self.ctx.say(f"search {self.ctx.name} as {generation}: nothing searchable: {refused}")
            return {**{m: None for m in METRICS}, "k": self.ctx.config.search.eval_k or len(gallery),
                    "searched_items": 0, "gallery_items": len(gallery),
                    "skipped": "; ".join(s.describe() for s in refused.shards), "paths": {}}
        for skipped in router.skipped:
            self.ctx.say(f"search {self.ctx.name} as {generation}: not searched: {skipped.describe()}")
        evaluation = evaluate_search(router, queries, query_labels, gallery.ids, gallery.labels,
                                     self.ctx.config.search.eval_k, query_ids, queries_by_generation=others)
        return {**evaluation.as_row(), "paths": router.paths()}

    def _previous_full_backfill(self, generation: str) -> dict[str, Any] | None:
        """The same-generation baseline: the previous served generation on a gallery wholly its
        own (its full-backfill row), i.e. what serving gave before this update; None for the first."""
        served = [g.name for g in self.ctx.config.served_generations]
        position = served.index(generation)
        if position == 0:
            return None
        outputs = self.ctx.store.committed_outputs(gallery_eval_key(self.ctx.name, served[position - 1]))
        if outputs is None or "full_backfill" not in outputs:
            return None
        return {"generation": served[position - 1], **outputs["full_backfill"]}

    def _curve(self, plan: GalleryPlan, full: ShardEmbeddings, queries, query_labels, query_ids, models,
               parents, others: dict[str, torch.Tensor]) -> dict[str, Any]:
        """mAP of the served gallery when the first ⌊β·N⌋ items of the plan's priority order hold
        the new generation and the rest what they held before the plan (λ-orth §2.11)."""
        before = [read_recorded_shard(b) for b in plan.before if b.n_items]
        order = plan.order_array()
        points = []
        for beta in DEFAULT_FRACTIONS:
            moved = order[:budget_count(beta, len(order))]
            shards = [s.without(moved) for s in before]
            shards = [s for s in shards if len(s)]
            if moved.size:
                shards.append(full.take(np.flatnonzero(np.isin(full.ids, moved))))
            result = evaluate_mixed_gallery(plan.generation, queries, query_labels, query_ids, shards, models, parents,
                                            queries_by_generation=others)
            points.append((beta, result.mean_ap))
        files = write_backfill_curve(join_uri(self.ctx.reports, f"backfill-{self.ctx.name}-{plan.generation}"), points,
                                     metric="map", title=f"{plan.generation}: {plan.policy['order']} order")
        return {"points": points, **files, "order": plan.policy["order"]}
