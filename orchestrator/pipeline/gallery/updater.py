"""The gallery side of the pipeline: four parts that each own one job, built together for the runner.

For every served generation, in order:

1. ``plan:<gallery>:<gen>`` (``planner.GalleryPlanner``): freeze what this generation does
   to the gallery (``plan``).
1b. ``gate:<gallery>:<gen>`` (``gate.GateMeter``, when another generation serves): what
   the deployment gate checks, measured before any shard changes; the runner decides
   (``pipeline.gate``) and may escalate the plan to a full one (``plan:<gallery>:<gen>:full``).
2. ``embed:<gallery>/<shard>:<gen>`` / ``split:<gallery>/<shard>:<gen>``
   (``execute.GalleryExecutor``): each shard update runs on a Ray worker that reads,
   embeds and writes its shard's files; the driver commits the returned metadata. No item passes
   through the driver.
3. (after deployment) ``gallery-eval:<gallery>:<gen>`` (``evaluate.GalleryEvaluator``):
   retrieval quality of the served, mixed gallery on a labelled sample.

What the parts share (the file, the lineage, the source, the models) is one ``GalleryContext``.
"""
from __future__ import annotations

from collections.abc import Callable

from orchestrator.config import PipelineConfig
from orchestrator.data import LabeledImages
from orchestrator.lineage import LineageStore
from orchestrator.pipeline.gallery.context import GalleryContext
from orchestrator.pipeline.gallery.evaluate import GalleryEvaluator
from orchestrator.pipeline.gallery.execute import GalleryExecutor
from orchestrator.pipeline.gallery.gate import GateMeter
from orchestrator.pipeline.gallery.planner import GalleryPlanner


class GalleryUpdater:
    """One gallery's updates for a ``PipelineRunner``: the four parts built over one shared context
    (arguments: ``GalleryContext``). Callers ask the part that owns the job: ``planner.plan`` /
    ``planner.committed_plan``, ``gate.measure_gate``, ``executor.execute``, ``evaluator.evaluate``;
    the gallery's name is ``ctx.name``."""

    def __init__(self, config: PipelineConfig, store: LineageStore, storage: str,
                 normalisation: tuple[tuple[float, ...], tuple[float, ...]], eval_images: Callable[[], LabeledImages],
                 say: Callable[[str], None], ensure_ray: Callable[[], None] = lambda: None):
        self.ctx = GalleryContext(config, store, storage, normalisation, eval_images, say, ensure_ray)
        self.planner = GalleryPlanner(self.ctx)
        self.gate = GateMeter(self.ctx)
        self.executor = GalleryExecutor(self.ctx)
        self.evaluator = GalleryEvaluator(self.ctx, self.planner)
