"""Planning a generation's gallery update (``plan:<gallery>:<gen>``): which shards or items it
embeds, in what order, frozen in a plan file before any work starts (``plan``).

The first served generation embeds every shard (contiguous row ranges of the source); later ones
follow their backfill policy, with priorities computed per shard on Ray (``ScoredGallery``) and
the exact gallery-wide selection of ``orchestrator.backfill.selection`` (selection files per
shard). The gate may escalate a plan to a full one (``plan:<gallery>:<gen>:full``).
"""
from __future__ import annotations

import json

import numpy as np

from orchestrator.backfill.compatibility_order import compatibility_ranks
from orchestrator.backfill.orders import get_order
from orchestrator.backfill.policy import ShardPriority, curve_order, reembeds_whole_shards, select_items, whole_shards
from orchestrator.config import BackfillPolicy
from orchestrator.distributed.backfill_scores import PriorityRule, ScoredGallery, ShardToScore
from orchestrator.integrity import IntegrityError, sha256_bytes
from orchestrator.lineage.records import ShardRecord
from orchestrator.lineage.step_keys import plan_key
from orchestrator.models.adapters import FORWARD_ADAPTER
from orchestrator.pipeline.gallery.context import GalleryContext
from orchestrator.pipeline.gallery.plan import GalleryPlan, ShardBefore
from orchestrator.pipeline.verify import refuse_unknown_file
from orchestrator.shard_update.update import ShardUpdate, UpdateKind
from orchestrator.storage import join_uri, read_bytes, write_json_atomic


class GalleryPlanner:
    """Computes, stores and reads back the plans of one gallery's generations."""

    def __init__(self, ctx: GalleryContext):
        self.ctx = ctx

    def plan(self, generation, key: str, policy: BackfillPolicy | None = None) -> GalleryPlan:
        """Compute and store the plan of ``generation`` (a ``GenerationSpec``), committing ``key``;
        ``policy`` overrides the generation's backfill policy (the gate's escalation to a full one)."""
        source = self.ctx.source
        if not any(g.name == self.ctx.name for g in self.ctx.store.galleries()):
            self.ctx.store.upsert_gallery(self.ctx.name, source.description, source.num_items,
                                      self.ctx.spec.shard_count(source.num_items))
        shards = self.ctx.store.shards(self.ctx.name)
        before = tuple(ShardBefore(s.index, s.generation, s.embeddings_uri, s.sha256, s.n_items) for s in shards)
        policy = policy or generation.backfill
        if all(s.generation is None for s in shards):  # first population: every shard, whatever the policy
            bounds = np.cumsum([0] + initial_shard_sizes(source.num_items, len(shards)))
            entries = tuple(ShardUpdate(UpdateKind.EMBED, s.index, int(bounds[s.index + 1] - bounds[s.index]),
                                      rows=(int(bounds[s.index]), int(bounds[s.index + 1]))) for s in shards)
            order: tuple[int, ...] = ()
        else:
            if any(s.generation is None for s in shards):
                raise RuntimeError(f"gallery {self.ctx.name!r}: shards {[s.index for s in shards if s.generation is None]} "
                                   "were never embedded although others were; the lineage is inconsistent")
            entries, order = self._backfill_entries(generation, policy, shards)
        plan = GalleryPlan(self.ctx.name, generation.name, policy.model_dump(mode="json"), entries, before, order)
        uri = join_uri(self.ctx.root, "plans", f"{generation.name}{'' if policy is generation.backfill else '.full'}.json")
        refuse_unknown_file(self.ctx.store, key, uri)
        write_json_atomic(uri, self.ctx.locations.relative_json(plan.to_json()))
        self.ctx.store.commit_step(key, {"plan_uri": uri, "entries": len(entries), "items": plan.num_items,
                                     "sha256": sha256_bytes(read_bytes(uri))})
        self.ctx.say(f"{key}: {len(entries)} shard update(s), {plan.num_items} of {source.num_items} items "
                 f"({policy.policy}{'' if policy.budget is None else f' {policy.budget:g} of the {policy.budget_unit}'}, "
                 f"order {policy.order})")
        return plan

    def committed_plan(self, generation: str) -> GalleryPlan:
        """The plan ``generation`` executes: the gate's escalated full plan if there is one."""
        outputs = (self.ctx.store.committed_outputs(plan_key(self.ctx.name, generation, full=True))
                   or self.ctx.store.committed_outputs(plan_key(self.ctx.name, generation)))
        data = read_bytes(outputs["plan_uri"])
        if "sha256" in outputs and sha256_bytes(data) != outputs["sha256"]:
            raise IntegrityError(f"{outputs['plan_uri']}: plan file changed since it was written: sha256 "
                                 f"{sha256_bytes(data)}, the lineage holds {outputs['sha256']}")
        return GalleryPlan.from_json(self.ctx.locations.resolve_json(json.loads(data)))

    def _backfill_entries(self, generation, policy: BackfillPolicy,
                          shards: list[ShardRecord]) -> tuple[tuple[ShardUpdate, ...], tuple[int, ...]]:
        """The plan's entries from priorities computed on Ray, shard by shard (``ScoredGallery``),
        by the policy rules of ``backfill.policy``, without the gallery in the driver."""
        curves = self.ctx.config.evaluation.backfill_curves
        if policy.policy == "none" and not curves:
            return (), ()
        candidates = [s for s in shards if s.generation != generation.name]
        self.ctx.ensure_ray()
        scored = ScoredGallery(self._priority_rule(generation, policy),
                               [ShardToScore(s.index, s.embeddings_uri, s.sha256) for s in candidates])
        summaries = [ShardPriority(x["index"], x["n"], x["mean"]) for x in scored.summaries]
        order = tuple(int(i) for i in curve_order(policy, summaries, scored.all_keys())) if curves else ()
        if policy.policy == "none":
            return (), order
        if reembeds_whole_shards(policy):
            return tuple(ShardUpdate(UpdateKind.EMBED, s.index, s.n) for s in whole_shards(policy, summaries)), order
        selection = select_items(policy, scored.ask(), sum(s.n for s in summaries))
        if selection.threshold is None:
            return (), order
        uris = [join_uri(self.ctx.root, "plans", f"{generation.name}.selection", f"shard-{s.index:05d}.parquet")
                for s in candidates]
        chosen = scored.write_chosen(selection.threshold, uris)
        entries, next_index = [], len(shards)
        for position in selection.shards_in_order:
            count, sha = chosen[position]
            index = candidates[position].index
            if sha is None:
                entries.append(ShardUpdate(UpdateKind.EMBED, index, count))
            else:
                entries.append(ShardUpdate(UpdateKind.SPLIT, index, count, selection=(uris[position], sha),
                                           target=next_index))
                next_index += 1
        return tuple(entries), order

    def _priority_rule(self, generation, policy: BackfillPolicy) -> PriorityRule:
        """What the scoring tasks need for the policy's order (``backfill.orders``): the forward
        map of a class-mean order, the compatibility ranks of ``least_compatible``."""
        name = "random" if policy.policy == "none" else policy.order
        order = get_order(name)
        forward, ranks = None, None
        if order.needs_class_means and FORWARD_ADAPTER in self.ctx.model(generation.name).adapters:
            record = self.ctx.store.get_generation(generation.name)
            forward = (record.checkpoint_uri, record.sha256)
        if order.needs_generation_ranks:
            ranks = compatibility_ranks(self._cross_values(generation.name))
        return PriorityRule(name, generation.training.seed, f"generation {generation.name!r} backfill.order {name!r}",
                            forward_model=forward, mapped_generation=generation.parent, generation_ranks=ranks)

    def _cross_values(self, generation: str) -> dict[str, float | None]:
        """Older generation → the recorded M(generation^Q, older^G) on the evaluation split
        (``search.criterion_metric``; None where they have no common distance)."""
        metric, split = self.ctx.config.search.criterion_metric, self.ctx.config.data.eval_split
        return {r.gallery: r.value for r in self.ctx.store.compatibility_values(split)
                if r.query == generation and r.gallery != generation and r.metric == metric}

def initial_shard_sizes(num_items: int, num_shards: int) -> list[int]:
    """The sizes of the initial shards: contiguous row blocks differing by at most one, larger
    first (``numpy.array_split``; over rows sorted by id this is ``gallery.layout``'s id blocks)."""
    if num_items < num_shards:
        raise ValueError(f"{num_items} items cannot fill {num_shards} shards")
    return [num_items // num_shards + (1 if k < num_items % num_shards else 0) for k in range(num_shards)]
