"""The lifelong pipeline: for each generation train → evaluate, then deploy; every step recorded.

Each step has a key in the lineage (``train:<gen>``, ``evaluate:<gen>``, ``deploy:<gen>``). A step
already committed is skipped; otherwise it is started (attempts counted), its files are written
first (checkpoint folder: weights, then card) and its result rows commit in one transaction
together with the step. Killing the driver at any point and running the same command again
finishes the pipeline without redoing committed steps and without duplicate rows or files.
"""
from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from orchestrator.config import (
    RUNTIME_SECTIONS,
    BackfillPolicy,
    GenerationSpec,
    PipelineConfig,
    config_sha256,
    posthoc,
)
from orchestrator.data import ImageTensorDataset, channel_statistics, load_source, training_indices
from orchestrator.distributed.runtime import connect, dashboard_message
from orchestrator.distributed.train import GenerationJob, train_generation_with_ray
from orchestrator.evaluation import CompatibilityReport, sample_split
from orchestrator.integrity import check_checkpoint, load_checked_generation, trained_outputs
from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import (
    StepKind,
    deploy_key,
    evaluate_key,
    gallery_eval_key,
    gate_key,
    parse_step_key,
    plan_key,
    train_key,
)
from orchestrator.lineage.store import STEP_SPEC, clean_json
from orchestrator.metrics import KEY_METRICS, METRICS, format_value
from orchestrator.models.checkpoint import load_card
from orchestrator.models.checkpoint_layout import CARD_FILE, WEIGHTS_FILE
from orchestrator.pipeline.evaluate_step import EVAL_EMBEDDINGS, eval_embeddings_uri, evaluate_once, recorded_embeddings
from orchestrator.pipeline.gallery.updater import GalleryUpdater
from orchestrator.pipeline.gate import (
    DeploymentHeld,
    GateDecision,
    GateMeasurement,
    decide,
    drop_within_noise,
    noise_unmeasured,
    wasted_backfill,
)
from orchestrator.pipeline.operations import shard_snapshot
from orchestrator.pipeline.quality_warning import own_quality_warnings, reference_p_up, self_tests
from orchestrator.pipeline.report import (
    compatibility_matrix,
    format_gallery_rows,
    format_matrix,
    gallery_report_rows,
    update_label,
    write_gallery_report,
    write_report,
)
from orchestrator.pipeline.step_specs import ChangedStepSpec, changed_fields, evaluate_spec, plan_spec, recorded_spec, train_spec
from orchestrator.pipeline.tracking import open_tracker
from orchestrator.pipeline.verify import refuse_unknown_file, refuse_unknown_storage
from orchestrator.storage import join_uri, remove_stale_temporaries
from orchestrator.training.health import TrainingUnhealthy
from orchestrator.training.seeds import derive_seed

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


@dataclass
class PipelineResult:
    """What a run produced: generation names in order, the matrices, per-update summaries, files."""

    names: list[str]
    matrices: dict[str, np.ndarray]
    summaries: dict[str, dict[str, Any]]
    report_files: list[str] = field(default_factory=list)
    skipped_steps: list[str] = field(default_factory=list)
    gallery: list[dict[str, Any]] = field(default_factory=list)

    def format(self) -> str:
        parts = [format_matrix(self.matrices[m], self.names, m) for m in KEY_METRICS]
        if self.summaries:
            lines = [f"{'update':<24}{'metric':>8}{'self':>9}{'cross':>9}{'old self':>10}{'saved':>8}{'P_com':>9}"
                     f"{'P_up':>9}  compatible"]
            for update, per_metric in self.summaries.items():
                for metric in KEY_METRICS:
                    s = per_metric[metric]
                    cells = "".join(format_value(s.get(k), digits, width) for k, digits, width in
                                    (("self", 4, 9), ("cross", 4, 9), ("old_self", 4, 10), ("backfill_saved", 2, 8),
                                     ("p_com", 3, 9), ("p_up", 3, 9)))
                    lines.append(f"{update:<24}{metric:>8}{cells}  {'yes' if s['compatible'] is True else 'no'}")
            parts.append("\n".join(lines))
        if self.gallery:
            parts.append(format_gallery_rows(self.gallery))
        return "\n\n".join(parts)


class PipelineRunner:
    """Runs a ``PipelineConfig`` against its storage, lineage and Ray cluster."""

    def __init__(self, config: PipelineConfig, progress: Progress | None = None):
        self.config = config
        self.progress = progress or (lambda line: print(line, flush=True))
        self.storage = storage_root(config.storage)
        self.store = LineageStore(config.lineage, storage=self.storage)
        self.config_sha = config_sha256(config, exclude=RUNTIME_SECTIONS)
        self._started = time.perf_counter()
        self._started_at = time.time()
        self._train_images = None
        self._eval_images = None
        self._skipped: list[str] = []
        self._warned: set[str] = set()
        self._parents = {g.name: g.parent for g in config.generations}
        self.tracker = open_tracker(config, self.storage, self._say)

    # --- data --------------------------------------------------------------------------------
    @property
    def train_images(self):
        if self._train_images is None:
            self._train_images = load_source(self.config.data.source, **self.config.data.loader_kwargs(self.config.data.train_split))
        return self._train_images

    @property
    def eval_images(self):
        if self._eval_images is None:
            self._eval_images = load_source(self.config.data.source, **self.config.data.loader_kwargs(self.config.data.eval_split))
        return self._eval_images

    @functools.cached_property
    def eval_data(self) -> ImageTensorDataset:
        """The evaluation sample (``evaluation.eval_sample`` of the evaluation split) as the
        generations embed it for the compatibility matrices."""
        mean, std = self.normalisation
        size = self.config.data.image_size or int(self.eval_images.images.shape[1])
        return ImageTensorDataset(sample_split(self.eval_images, self.config.evaluation.eval_sample), size, mean, std)

    @functools.cached_property
    def normalisation(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean and std of the training split, shared by every generation (computed once)."""
        return channel_statistics(self.train_images)

    @functools.cached_property
    def gallery(self) -> GalleryUpdater:
        return GalleryUpdater(self.config, self.store, self.storage, self.normalisation, lambda: self.eval_images, self._say,
                              ensure_ray=self.ensure_ray)

    def ensure_ray(self) -> None:
        """Connect to (or start) Ray as the file says, once, when the first step that needs it runs
        (training, scoring or embedding a gallery): a re-run whose steps have all committed, or one
        refused before any work, starts no Ray. Prints the dashboard's address when Ray gives one
        (``connect`` does nothing, and returns None, once Ray is up)."""
        dashboard = connect(self.config.ray.address, dashboard=self.config.ray.dashboard)
        if dashboard:
            self.progress(dashboard_message(dashboard))

    def generation_uri(self, name: str) -> str:
        return join_uri(self.storage, "generations", name)

    # --- steps -------------------------------------------------------------------------------
    def locked(self, purpose: str):
        """``with runner.locked("orchestrator run"):`` — the pipeline's run lock (reentrant; another
        process holding it: ``LineageBusy`` naming the holder, before anything is recorded)."""
        return self.store.run_lock(self.config.name, purpose)

    def run(self) -> PipelineResult:
        """Every generation: train, evaluate; every served one then plans and executes its gallery
        update, is deployed, and is evaluated on the served (mixed) gallery. Under the run lock;
        first, temporary files that an earlier, killed run's writes left in the storage are removed
        (no other run of the pipeline can be writing them: the lock says so). With tracking on, the
        whole run is an MLflow run (``tracking``), FINISHED or FAILED as the run ends."""
        with self.locked("pipeline run"):
            return self._run()

    def _run(self) -> PipelineResult:
        refuse_unknown_storage(self.store, self.storage, self.config.lineage)
        self.store.register_run(self.config.name, self.config_sha)
        removed = remove_stale_temporaries(self.storage, self._started_at)
        if removed:
            self._say(f"removed {removed} temporary file(s) left by interrupted writes under {self.storage}")
        served = {g.name for g in self.config.served_generations}
        with self.tracker.pipeline_run(self.config_sha):
            for generation in self.config.generations:
                self.tracker.start_generation(generation)
                self._step(train_key(generation.name), lambda key, g=generation: self._train(g, key),
                           self._train_spec(generation), generation.name)
                record = self.store.get_generation(generation.name)
                self.tracker.log_checkpoint(generation.name, record.checkpoint_uri, record.sha256)
                self._step(evaluate_key(generation.name), lambda key, g=generation: self._evaluate(g, key),
                           evaluate_spec(self.config), generation.name)
                self._warn_own_quality()
                if generation.name in served:
                    self._serve(generation)
            return self._finish()

    def _warn_own_quality(self) -> None:
        """Say ``evaluation.warn_p_up``'s warning, once per run, for each generation whose own mAP
        and the reference's are both measured (``quality_warning``)."""
        evaluation = self.config.evaluation
        selfs = self_tests(self.store.compatibility_values(dataset=self.config.data.eval_split))
        parents = {g.name: g.parent for g in self.config.generations}
        for name, line in own_quality_warnings(selfs, parents, evaluation.reference, evaluation.warn_p_up).items():
            if name not in self._warned:
                self._warned.add(name)
                self._say(line)

    def _p_up(self, name: str) -> float | None:
        """P_up on mAP of generation ``name`` against ``evaluation.reference`` (``reference_p_up``)."""
        selfs = self_tests(self.store.compatibility_values(dataset=self.config.data.eval_split))
        return reference_p_up(selfs, name, self.config.evaluation.reference)

    def _serve(self, generation) -> None:
        """Gallery plan and shard updates, deployment, then the served gallery's evaluation."""
        gallery = self.gallery
        self._step(plan_key(gallery.ctx.name, generation.name), lambda key: gallery.planner.plan(generation, key),
                   plan_spec(self.config, generation), generation.name)
        decision = self._gate(generation)
        plan = gallery.planner.committed_plan(generation.name)
        gallery.executor.execute(plan, generation.name)
        self._step(deploy_key(generation.name), lambda key: self._deploy(generation, key, decision))
        self._step(gallery_eval_key(gallery.ctx.name, generation.name),
                   lambda key: self.store.commit_step(key, gallery.evaluator.evaluate(generation.name, self._parents)))

    def _gate(self, generation) -> GateDecision | None:
        """Measure the gate once (``gate:<gallery>:<gen>``, committed), decide under the current
        ``gate`` settings, and act: ``hold`` fails the deploy step and stops the run (the serving
        generation keeps serving, no shard has changed); ``full_backfill`` plans a full re-embed
        (``plan:<gallery>:<gen>:full``) that ``execute`` then follows. None: nothing serves yet
        (or this generation already does), or this generation's deployment has committed already
        (a resumed run: a later generation may serve by now, and the gate is not asked again)."""
        serving = self.store.current_deployment()
        if serving is None or serving.generation == generation.name:
            return None
        if self.store.step_status(deploy_key(generation.name)) == "committed":
            return None
        gallery = self.gallery
        plan = gallery.planner.committed_plan(generation.name)
        self._step(gate_key(gallery.ctx.name, generation.name), lambda key: self.store.commit_step(
            key, {**gallery.gate.measure_gate(plan, serving.generation, self._parents).to_json(),
                  "p_up": self._p_up(generation.name)}))
        measurement = GateMeasurement.from_json(self.store.committed_outputs(gate_key(gallery.ctx.name, generation.name)))
        decision = decide(measurement, generation.gate)
        self._say(decision.describe())
        for note in (wasted_backfill(measurement), drop_within_noise(measurement, generation.gate, decision),
                     noise_unmeasured(measurement, generation.gate)):
            if note is not None:
                self._say(note)
        if measurement.unmeasured:
            self._say(f"gate of {generation.name}: served quality not checked: {measurement.unmeasured}")
        if decision.action == "full_backfill" and measurement.full_backfill is None and not measurement.unmeasured:
            self._say(f"gate of {generation.name}: the full backfill's quality not checked (its gate was measured "
                      "before this version recorded it)")
        if generation.gate.min_p_up is not None and measurement.p_up is None:
            self._say(f"gate of {generation.name}: min_p_up not checked: no measured reference (evaluation.reference)")
        if decision.action == "hold":
            position = [g.name for g in self.config.generations].index(generation.name)
            other_actions = ("force" if generation.gate.action == "full_backfill"
                             else "full_backfill (re-embed the whole gallery) or force")
            held = DeploymentHeld(
                f"{decision.describe()}. {serving.generation} keeps serving; to go on, set "
                f"generations.{position}.gate.action to {other_actions}, or train a better generation, "
                "and run again")
            self._step(deploy_key(generation.name), lambda key: _raise(held))
        if decision.action == "full_backfill":
            policy = BackfillPolicy(policy="full", order="random" if generation.backfill.policy == "none"
                                    else generation.backfill.order)
            self._step(plan_key(gallery.ctx.name, generation.name, full=True), lambda key: gallery.planner.plan(generation, key, policy))
        return decision

    def _deploy(self, generation, key: str, decision: GateDecision | None) -> None:
        outputs = {"generation": generation.name, "gate": None if decision is None else decision.to_json(),
                   "shards": shard_snapshot(self.store.shards(self.gallery.ctx.name))}
        self.store.deploy(generation.name, step=key, step_outputs=outputs)
        self._say(f"{key}: {generation.name} serves queries")

    def _check_reused(self, key: str) -> None:
        """Before a committed train step is skipped: its checkpoint (card and weights) must still be
        the one the lineage recorded (``IntegrityError`` otherwise), since later steps load it."""
        step = parse_step_key(key)
        if step.kind is StepKind.TRAIN and self.store.has_generation(step.generation):
            record = self.store.get_generation(step.generation)
            if record.checkpoint_uri is not None:
                check_checkpoint(self.store, record)

    def _step(self, key: str, action: Callable[[str], Any], spec: dict[str, Any] | None = None,
              generation: str = "") -> bool:
        """Run ``action(key)`` as lineage step ``key`` unless it already committed; returns whether
        it ran. The action commits the step itself (with its result rows, in one transaction).
        ``spec``: what the step runs from (``step_specs``); a committed step recorded with another
        one is refused (``ChangedStepSpec``, naming the fields), not skipped."""
        step = self.store.get_step(key)
        if step is not None and step.status == "committed":
            recorded = step.outputs.get(STEP_SPEC)
            if spec is not None and recorded is not None:
                current = clean_json(spec)
                changed = changed_fields(recorded_spec(recorded, current), current)
                if changed:
                    raise ChangedStepSpec(key, changed, generation)
            self._check_reused(key)
            self._skipped.append(key)
            self._say(f"{key}: already committed, skipped")
            return False
        self.store.start_step(key, spec=spec)
        started = time.perf_counter()
        try:
            action(key)
        except BaseException as error:  # a health stop is recorded as its one line
            self.store.fail_step(key, f"stopped by the health check: {error.line}"
                                 if isinstance(error, TrainingUnhealthy) else error)
            raise
        self._say(f"{key}: done in {time.perf_counter() - started:.1f} s")
        return True

    def train_generations(self, names: list[str]) -> list[str]:
        """Only the ``train:<gen>`` steps of the named generations, in the file's order (their
        parents must be among them or trained already); committed steps are skipped, so a sweep
        and a later ``run`` of the same file share these generations. Returns the skipped keys.
        Under the run lock."""
        with self.locked("pipeline training"):
            self.store.register_run(self.config.name, self.config_sha)
            already = len(self._skipped)
            for generation in self.config.generations:
                if generation.name in names:
                    self._step(train_key(generation.name), lambda key, g=generation: self._train(g, key),
                               self._train_spec(generation), generation.name)
            return self._skipped[already:]

    def generation_job(self, generation: GenerationSpec, output_uri: str) -> GenerationJob:
        """The training job of ``generation`` (its parent already trained): its items, the shared
        normalisation, the parent's checkpoint from the lineage, and the seed derived from the
        generation's name, so the same spec always trains the same model (a sweep's trials
        build their jobs here too)."""
        config = self.config
        images = self.train_images
        indices = training_indices(generation, images.labels, config.data.task_splits)
        mean, std = self.normalisation
        parent_uri = parent_sha = encoder_uri = encoder_sha = pairs_source = None
        if generation.parent is not None:
            parent = self.store.get_generation(generation.parent)
            parent_uri, parent_sha = parent.checkpoint_uri, parent.sha256
        if generation.encoder_from is not None:
            given = self.store.get_generation(generation.encoder_from)
            encoder_uri, encoder_sha = given.checkpoint_uri, given.sha256
        if generation.method.params.get("pairs_from") == "gallery":
            pairs_source = config.data.source
        return GenerationJob(
            name=generation.name, method=generation.method.name, method_params=dict(generation.method.params),
            encoder=generation.model.model_dump(mode="json"), training=generation.training.model_dump(mode="json"),
            num_classes=images.num_classes, data_source=config.data.source,
            data_options=config.data.loader_kwargs(config.data.train_split),
            image_size=config.data.image_size or int(images.images.shape[1]), mean=tuple(mean), std=tuple(std),
            train_ids=images.ids[indices].tolist(), parent_name=generation.parent, parent_uri=parent_uri,
            parent_sha256=parent_sha, seed=derive_seed(generation.training.seed, generation.name), output_uri=output_uri,
            init_from_parent=generation.init_from_parent, replaces=generation.replaces,
            health=generation.health.model_dump(mode="json"), health_source=config.data.source,
            health_options=config.data.loader_kwargs(config.data.eval_split),
            encoder_uri=encoder_uri, encoder_sha256=encoder_sha, pairs_source=pairs_source,
            pairs_options=config.data.loader_kwargs(config.gallery.split) if pairs_source else {},
        )

    def _train_spec(self, generation) -> dict[str, Any]:
        parent = given = None
        if generation.parent is not None and self.store.has_generation(generation.parent):
            parent = self.store.get_generation(generation.parent).sha256
        if generation.encoder_from is not None and self.store.has_generation(generation.encoder_from):
            given = self.store.get_generation(generation.encoder_from).sha256
        return train_spec(self.config, generation, parent, given)

    def _train(self, generation, key: str) -> None:
        config = self.config
        self.store.upsert_generation(generation.name, parent=generation.parent, method=generation.method.name,
                                     params=generation.method.params, arch=generation.model.arch,
                                     status="training")
        output = self.generation_uri(generation.name)
        for name in (CARD_FILE, WEIGHTS_FILE):
            refuse_unknown_file(self.store, key, join_uri(output, name))
        job = self.generation_job(generation, output)
        scaling = config.ray
        where = f"{scaling.num_workers} worker(s)" if scaling.num_workers else "in the driver (Ray Train local mode)"
        if not posthoc.trains_encoder(generation):
            given = generation.encoder_from or generation.model.pretrained
            self._say(f"{key}: {generation.method.name}: the encoder of {given} frozen, a map to {generation.parent} "
                      f"fitted on at most {generation.method.params['pairs']} pairs "
                      f"({generation.method.params['pairs_from']} items), {where}")
        else:
            self._say(f"{key}: {generation.method.name} on {len(job.train_ids)} items, {generation.training.epochs} "
                      f"epochs, {where}")
        self.ensure_ray()
        try:
            metrics = train_generation_with_ray(job, scaling, storage_path=join_uri(self.storage, "ray"),
                                                run_name=f"train-{generation.name}-{self.config_sha[:8]}",
                                                progress=lambda line: self._say(f"{key}: {line}"),
                                                on_epoch=self.tracker.epoch_callback(generation.name))
        except TrainingUnhealthy as stop:
            self.store.set_generation_status(generation.name, "failed")
            self._say(f"{key}: stopped by the health check: {stop.line}")
            setting = f"generations.{self.config.generations.index(generation)}.health"
            raise TrainingUnhealthy(stop.line, generation.name, key, setting) from None
        health = {k.removeprefix("health/"): v for k, v in metrics.items() if k.startswith("health/")}
        card = load_card(output)
        self.store.upsert_generation(generation.name, space=card.space, curv=card.curv)
        self.store.mark_generation_trained(
            generation.name, output, card.sha256,
            metrics={k: v for k, v in metrics.items()
                     if k.startswith(("loss", "health/")) or k in ("epoch", "lr", "fit_seconds")},
            step=key, step_outputs={**trained_outputs(output, card.sha256), **({"health": health} if health else {})},
        )

    def _evaluate(self, generation, key: str) -> None:
        """Compatibility of this generation's queries against every earlier generation's gallery:
        this generation embeds the evaluation sample once (stored), the earlier ones' stored
        embeddings are reused (``evaluate_step``)."""
        names = [g.name for g in self.config.generations[: self.config.generations.index(generation) + 1]]
        models = {}
        for name in names:
            models[name], _card = load_checked_generation(self.store, self.store.get_generation(name))
        stored = {name: recorded_embeddings(self.store.committed_outputs(evaluate_key(name)), evaluate_key(name))
                  for name in names[:-1]}
        split = self.config.data.eval_split
        parents = {g.name: g.parent for g in self.config.generations if g.parent}
        report, embeddings = evaluate_once(generation.name, models, self.eval_data, parents, stored,
                                           eval_embeddings_uri(self.storage, generation.name, split))
        rows = []
        for gallery in names:
            for metric in METRICS:
                value = report.value(generation.name, gallery, metric)
                if not np.isnan(value) or (generation.name, gallery) in report.notes:
                    rows.append((generation.name, gallery, metric, value, split))
        self.store.record_compatibility(rows, step=key, step_outputs={"pairs": len(rows) // len(METRICS),
                                                                      EVAL_EMBEDDINGS: embeddings})

    # --- results -----------------------------------------------------------------------------
    def _finish(self) -> PipelineResult:
        names = [g.name for g in self.config.generations]
        values = self.store.compatibility_values(dataset=self.config.data.eval_split)
        matrices = {metric: compatibility_matrix(values, names, metric) for metric in METRICS}
        summaries = self._update_summaries(matrices, names)
        reports = join_uri(self.storage, "reports")
        files = write_report(reports, names, values, summaries)
        served = [self.store.committed_outputs(gallery_eval_key(self.gallery.ctx.name, g.name))
                  for g in self.config.served_generations]
        gallery_rows = gallery_report_rows([s for s in served if s])
        for unscored in {s["skipped"] for s in served if s and "skipped" in s}:
            self._say(f"served gallery {self.gallery.ctx.name}: not scored: {unscored}")
        files += write_gallery_report(reports, self.gallery.ctx.name, gallery_rows)
        self._say(f"report written to {reports}")
        updates = {g.name: summaries[update_label(g.parent, g.name)] for g in self.config.generations if g.parent}
        self.tracker.log_results(names, matrices, updates, files)
        return PipelineResult(names, matrices, summaries, files, self._skipped, gallery_rows)

    def _update_summaries(self, matrices: dict[str, np.ndarray], names: list[str]) -> dict[str, dict[str, Any]]:
        report = CompatibilityReport(names, matrices)
        reference = self.config.evaluation.reference
        return {
            update_label(generation.parent, generation.name): {
                metric: {k: _json_number(v) for k, v in
                         report.update_summary(generation.parent, generation.name, metric, reference).items()}
                for metric in matrices
            }
            for generation in self.config.generations if generation.parent is not None
        }

    def _say(self, message: str) -> None:
        self.progress(f"[{time.perf_counter() - self._started:7.1f}s] {message}")


def _raise(error: BaseException) -> None:
    raise error


def run_pipeline(config: PipelineConfig, progress: Progress | None = None) -> PipelineResult:
    """Take the pipeline's run lock (``LineageBusy`` when another process has it: nothing started,
    not even Ray) and run it; see ``PipelineRunner``. Ray starts (or is joined) as the file says
    when the first step needs it (``PipelineRunner.ensure_ray``)."""
    runner = PipelineRunner(config, progress)  # a missing MLflow fails fast
    # the store closed when the run ends, not at the interpreter's exit: SQLite folds its
    # write-ahead log into the lineage file and removes it when the last connection closes
    with runner.store, runner.locked("orchestrator run"):
        return runner.run()


def _json_number(value: Any) -> Any:
    """A summary value as JSON takes it: floats as float, undefined (NaN) as None (printed n/a)."""
    if isinstance(value, (float, np.floating)):
        return None if np.isnan(value) else float(value)
    return value


def storage_root(storage: str) -> str:
    """Local storage as an absolute path (Ray Train needs one); URIs unchanged."""
    if "://" in storage and not storage.startswith("file://"):
        return storage
    return os.path.abspath(storage.removeprefix("file://"))
