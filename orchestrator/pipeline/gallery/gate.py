"""Measuring what a generation's deployment gate checks (``gate:<gallery>:<gen>``), before any
shard changes: the criterion against every older generation the plan leaves in the gallery, and
the served gallery's mAP after the plan, after a full re-embed and with nothing re-embedded,
predicted on the ``gallery-eval`` sample, with the standard errors of the first two against the
gallery as served now, paired query by query (``pipeline.gate`` decides on it)."""
from __future__ import annotations

import dataclasses

import numpy as np

from orchestrator.data import LabeledImages
from orchestrator.gallery import ShardEmbeddings, comparable_shards, evaluate_mixed_gallery, read_recorded_shard
from orchestrator.gallery.shard_files import read_selection
from orchestrator.lineage.step_keys import gallery_eval_key
from orchestrator.metrics import map_of_average_precisions, paired_difference_standard_error
from orchestrator.pipeline.gallery.context import GalleryContext
from orchestrator.pipeline.gallery.plan import GalleryPlan
from orchestrator.pipeline.gate import GateMeasurement
from orchestrator.search import CompatibilityCriterion
from orchestrator.shard_update.update import UpdateKind


class GateMeter:
    """Measures the gate of a planned gallery update (module docstring)."""

    def __init__(self, ctx: GalleryContext):
        self.ctx = ctx

    def measure_gate(self, plan: GalleryPlan, serving: str, parents: dict[str, str | None]) -> GateMeasurement:
        """What the gate of ``plan.generation`` checks (``pipeline.gate``), before any shard changes:
        the criterion against every older generation the plan leaves in the gallery, and the served
        gallery's mAP after the plan, after a full re-embed and with nothing re-embedded, predicted
        on the ``gallery-eval`` sample, next to the one the serving generation's report measured and
        the gallery as served now (the pairs whose standard errors the gate's noise margin uses)."""
        generation, split = plan.generation, self.ctx.config.data.eval_split
        metric = self.ctx.config.search.criterion_metric
        criterion = CompatibilityCriterion.from_records(self.ctx.store.compatibility_values(split), metric, split)
        stored = [b for b in plan.before if b.generation not in (None, generation) and b.n_items]
        verdict = {old: criterion.verdict(generation, old) for old in sorted({b.generation for b in stored})}
        replaced = {e.shard for e in plan.entries if e.kind is UpdateKind.EMBED}
        remaining = sorted({b.generation for b in stored if b.shard not in replaced})
        verdicts = [[old, verdict[old].admitted, verdict[old].reason] for old in remaining]
        measured = GateMeasurement(generation, serving, metric, verdicts)
        report = self.ctx.store.committed_outputs(gallery_eval_key(self.ctx.name, serving))
        if report is None or "mixed" not in report:
            why = (report or {}).get("skipped") or f"{serving}'s served gallery was never scored"
            return dataclasses.replace(measured, unmeasured=why)
        sample = self.ctx.labelled_sample(self.ctx.config.evaluation.gallery_sample)
        admitted = {generation} | {old for old, v in verdict.items() if v.admitted}
        before = [(b.shard, read_recorded_shard(b).restricted_to(sample.ids))
                  for b in plan.before if b.n_items]
        planned, full, nothing = self._predicted_quality(plan, before, sample, admitted, parents)
        now = self._served_now([part for _shard, part in before if len(part)], serving, sample, parents)
        mean = map_of_average_precisions
        return dataclasses.replace(measured, serving_quality=float(report["mixed"]["map"]), predicted=mean(planned),
                                   full_backfill=mean(full), no_backfill=mean(nothing), served_now=mean(now),
                                   predicted_se=paired_difference_standard_error(planned, now),
                                   full_backfill_se=paired_difference_standard_error(full, now))

    def _served_now(self, stored: list[ShardEmbeddings], serving: str, sample: LabeledImages,
                    parents: dict[str, str | None]) -> np.ndarray:
        """(N_q,) AP per query of the gallery as it serves now (``stored``: its shards restricted to
        ``sample``): the shards ``serving`` can compare with, searched by ``serving``'s queries (the
        rule of its ``gallery-eval`` report's mAP, the gate's baseline)."""
        for name in {s.generation for s in stored} | {serving}:
            self.ctx.model(name)
        queries, query_labels, query_ids = self.ctx.queries(serving, self.ctx.embed_locally(serving, sample))
        others = self.ctx.other_queries(serving, sample, parents)
        models = self.ctx.models_for(parents)
        gallery, _left_out = comparable_shards(serving, stored, models, parents)
        if not gallery:  # nothing it can search: every query retrieves nothing
            return np.zeros(len(query_labels))
        return evaluate_mixed_gallery(serving, queries, query_labels, query_ids, gallery, models,
                                      parents, queries_by_generation=others).average_precisions

    def _predicted_quality(self, plan: GalleryPlan, before: list[tuple[int, ShardEmbeddings]],
                           sample: LabeledImages, admitted: set[str],
                           parents: dict[str, str | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(N_q,) AP per query (NaN: no relevant item) on ``sample`` of the gallery as ``plan`` leaves
        it (the planned items embedded by the new generation, the others as stored; shards of
        generations the router would not admit are left out, as the router leaves them out), of
        the gallery fully re-embedded, and of the gallery as it is (nothing re-embedded, searched
        by the new generation's queries); an empty gallery retrieves nothing (AP 0).

        before: (shard, its stored items in ``sample``) for every non-empty shard the plan found."""
        generation = plan.generation
        full = self.ctx.embed_locally(generation, sample)
        shards, moved, unchanged = [], [], []
        for shard, stored in before:
            if len(stored) and stored.generation in admitted:
                unchanged.append(stored)
            chosen = self._planned_ids(plan, shard, stored)
            moved.append(chosen)
            kept = stored.without(chosen)
            if len(kept) and kept.generation in admitted:
                shards.append(kept)
        moved_ids = np.concatenate(moved) if moved else np.zeros(0, dtype=np.int64)
        if moved_ids.size:
            shards.append(full.restricted_to(moved_ids))
        for name in {s.generation for s in shards}:
            self.ctx.model(name)
        queries, query_labels, query_ids = self.ctx.queries(generation, full)
        others = self.ctx.other_queries(generation, sample, parents)
        models = self.ctx.models_for(parents)

        def served(gallery: list[ShardEmbeddings]) -> np.ndarray:
            if not gallery:
                return np.zeros(len(query_labels))
            return evaluate_mixed_gallery(generation, queries, query_labels, query_ids, gallery, models,
                                          parents, queries_by_generation=others).average_precisions

        return served(shards), served([full]), served(unchanged)

    @staticmethod
    def _planned_ids(plan: GalleryPlan, shard: int, stored: ShardEmbeddings) -> np.ndarray:
        """The ids of ``stored`` (shard ``shard`` as the plan found it) that the plan re-embeds."""
        for entry in plan.entries:
            if entry.shard != shard:
                continue
            if entry.kind is UpdateKind.EMBED:
                return stored.ids
            return np.intersect1d(stored.ids, read_selection(*entry.selection))
        return np.zeros(0, dtype=np.int64)
