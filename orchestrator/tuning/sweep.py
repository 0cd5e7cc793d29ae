"""A whole sweep: ``orchestrator tune FILE``.

1. Connect to (or start) Ray as the pipeline file says.
2. Train the candidate's parent (with its ancestors) and the evaluation reference through the
   pipeline's own ``train:<gen>`` steps (``PipelineRunner.train_generations``): trained once,
   recorded in the pipeline's lineage, shared by every trial and by a later ``orchestrator run``.
3. Run the trials with Ray Tune (``trial.run_trial``): the searcher and scheduler of the file,
   at most ``max_concurrent_trials`` at once, each with the file's resources (trial processes are
   reused, so torch and the data load once per process, not once per trial). The experiment lives
   in ``<sweep>/experiment`` (``<sweep>`` = ``<pipeline storage>/tune/<name>``); when that folder
   holds an experiment, running the same command again resumes it with ``Tuner.restore``:
   finished trials are kept, unfinished and errored ones start again from their first epoch
   (trials keep no per-epoch checkpoint; a restarted trial trains exactly as an uninterrupted one).
   A folder holding a sweep of another tune file or pipeline is refused (``sweep.json``).
4. Write the results (``results``) and record every trial in the lineage as a candidate.

Ray Tune keeps its own experiment state (trial table, searcher) in its folder, pickled by Ray;
everything this module writes is CSV, Parquet, PNG, YAML or JSON.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath
from typing import Any, Callable

import ray
from ray import tune
from ray.tune import Callback

from orchestrator.config import RUNTIME_SECTIONS, config_sha256
from orchestrator.distributed.runtime import connect, dashboard_message
from orchestrator.evaluation import evaluate_generations
from orchestrator.methods.loading import load_generation
from orchestrator.models.checkpoint import checkpoint_exists
from orchestrator.pipeline.runner import PipelineRunner
from orchestrator.progress import Meter
from orchestrator.storage import exists, join_uri, read_json, write_json_atomic
from orchestrator.training.config import COLLAPSED
from orchestrator.tuning import results as outputs
from orchestrator.tuning import space as spaces
from orchestrator.tuning.config import TuneFile
from orchestrator.tuning.objective import OBJECTIVE
from orchestrator.tuning.results import REPORTED, TrialRow
from orchestrator.tuning.saved_state import damaged_state_files
from orchestrator.tuning.trial import TrialSetup, run_trial

Progress = Callable[[str], None]
EXPERIMENT = "experiment"
GUARD = "sweep.json"


@dataclass
class SweepResult:
    """Every trial, the best one, the files written, and whether the run resumed an experiment."""

    rows: list[TrialRow]
    best: TrialRow | None
    files: dict[str, str]
    resumed: bool
    seconds: float

    @property
    def trial_epochs(self) -> int:
        """Compute spent: epochs trained, summed over trials."""
        return sum(row.epochs for row in self.rows)

    def format(self, metrics: list[str]) -> str:
        """A table of the trials (best first among finished ones), then the files."""
        order = sorted(self.rows, key=lambda r: (not r.best, r.outcome != "finished",
                                                 -(r.metrics.get(OBJECTIVE) or float("-inf"))))
        params = sorted({name for row in self.rows for name in row.params})
        widths = {name: max(12, len(name) + 2) for name in [*params, *metrics]}
        head = (f"{'trial':<14}{'outcome':<10}{'epochs':>7}" + "".join(f"{p:>{widths[p]}}" for p in params)
                + "".join(f"{m:>{widths[m]}}" for m in metrics))
        lines = [head, "-" * len(head)]
        for row in order:
            cells = "".join(f"{_cell(row.params.get(p)):>{widths[p]}}" for p in params)
            values = "".join(f"{_cell(row.metrics.get(m)):>{widths[m]}}" for m in metrics)
            mark = "  <- best" if row.best else ("  (front)" if row.pareto else "")
            lines.append(f"{row.trial_id[-14:]:<14}{row.outcome:<10}{row.epochs:>7}{cells}{values}{mark}")
        lines.append("")
        if self.best is None:
            lines.append("no finished trial meets the objective (its constraint): no generation block written")
        lines.append(f"{len(self.rows)} trials, {self.trial_epochs} trial-epochs, {self.seconds:.0f} s"
                     + (" (resumed)" if self.resumed else ""))
        lines += [f"{kind:>8}: {uri}" for kind, uri in self.files.items()]
        return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.4g}"  # undefined (e.g. P_com, docs/concepts.md)
    return str(value)


def trial_dirname(trial) -> str:
    """Trial folders named by trial id (the id is also the candidate's folder and lineage name)."""
    return trial.trial_id


class TrialLines(Callback):
    """A Tune callback printing one line when a trial starts, finishes, is stopped or fails, and
    counting the trials that ended (a bar on a terminal, else a line each)."""

    def __init__(self, epochs: int, trials: int):
        self.epochs = epochs
        self.meter = Meter(self._say, "trials ended", trials, interval=0.0)

    def _say(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    def on_trial_start(self, iteration, trials, trial, **info):
        self._say(f"trial {trial.trial_id} started: {trial.config}")

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        done = result.get(spaces.EPOCHS, 0)
        if result.get(COLLAPSED):
            self._say(f"trial {trial.trial_id} collapsed after {done}/{self.epochs} epochs: {result[COLLAPSED]}")
            self.meter.advance()
            return
        state = "finished" if done == self.epochs else "stopped early"
        self._say(f"trial {trial.trial_id} {state} after {done}/{self.epochs} epochs: "
                  f"{OBJECTIVE} {result.get(OBJECTIVE, float('nan')):.4f}")
        self.meter.advance()

    def on_trial_error(self, iteration, trials, trial, **info):
        self._say(f"trial {trial.trial_id} failed (its error is in {trial.path})")
        self.meter.advance()


def run_sweep(tune_file: TuneFile, progress: Progress | None = None) -> SweepResult:
    """Run (or resume) the sweep of ``tune_file``; see the module docstring."""
    say = progress or (lambda line: print(line, flush=True))
    started = time.perf_counter()
    runner = PipelineRunner(tune_file.pipeline, say)
    # the store closed when the sweep ends (as ``run_pipeline``); no run of the pipeline trains or deploys meanwhile
    with runner.store, runner.locked("orchestrator tune"):
        return _sweep(tune_file, runner, say, started)


def _sweep(tune_file: TuneFile, runner: PipelineRunner, say: Progress, started: float) -> SweepResult:
    spec, pipeline = tune_file.spec, tune_file.pipeline
    dashboard = connect(pipeline.ray.address, dashboard=pipeline.ray.dashboard)
    if dashboard:
        say(dashboard_message(dashboard))
    candidate = tune_file.candidate
    needed = (_ancestors(tune_file, candidate.parent) + ([pipeline.evaluation.reference] if pipeline.evaluation.reference else [])
              + ([candidate.encoder_from] if candidate.encoder_from else []))  # a post-hoc candidate's given encoder
    runner.train_generations(needed)

    sweep_uri = join_uri(runner.storage, "tune", spec.name)
    experiment = join_uri(sweep_uri, EXPERIMENT)
    _check_guard(sweep_uri, tune_file)
    setup = TrialSetup(
        job=asdict(runner.generation_job(candidate, output_uri=join_uri(sweep_uri, "candidates"))),
        eval_source=pipeline.data.source, eval_options=pipeline.data.loader_kwargs(pipeline.data.eval_split),
        image_size=pipeline.data.image_size or int(runner.eval_images.images.shape[1]),
        reference_self=_reference_self(runner), objective=spec.objective.model_dump(mode="json"),
        candidates_uri=join_uri(sweep_uri, "candidates"), threads=max(1, int(spec.resources.cpu)),
        eval_sample=pipeline.evaluation.eval_sample,
    )
    tuner, resumed = _tuner(tune_file, setup, sweep_uri, experiment)
    say(f"sweep {spec.name}: {'resuming' if resumed else 'starting'} {experiment}")
    grid = tuner.fit()
    if grid.num_terminated + grid.num_errors < len(grid):  # Tune returns after Ctrl-C, its state saved
        raise RuntimeError(f"sweep {spec.name} interrupted with {len(grid) - grid.num_terminated - grid.num_errors} "
                           f"trial(s) unfinished; run the same command again to resume it")

    rows = _rows(grid, list(spec.space), tune_file.reports, setup.candidates_uri)
    best = outputs.mark_front_and_best(rows, spec.objective)
    files = outputs.write_results(sweep_uri, tune_file, rows, best)
    outputs.record_candidates(runner.store, tune_file, rows)
    return SweepResult(rows, best, files, resumed, time.perf_counter() - started)


def _ancestors(tune_file: TuneFile, name: str) -> list[str]:
    """``name`` and its ancestors in the pipeline, oldest first."""
    chain = []
    current: str | None = name
    while current is not None:
        chain.append(current)
        current = tune_file.pipeline.generation(current).parent
    return chain[::-1]


def _reference_self(runner: PipelineRunner) -> dict[str, float] | None:
    """M(φ_*; φ_*) per metric of the evaluation reference (trained), on the evaluation sample."""
    name = runner.config.evaluation.reference
    if name is None:
        return None
    record = runner.store.get_generation(name)
    model, _card = load_generation(record.checkpoint_uri, expected_sha256=record.sha256)
    report = evaluate_generations({name: model}, runner.eval_data)
    return {metric: report.value(name, name, metric) for metric in report.matrices}


def _check_guard(sweep_uri: str, tune_file: TuneFile) -> None:
    """Refuse a sweep folder that holds another tune file's (or pipeline's) sweep; write the guard
    for a new folder."""
    identity = {"tune": tune_file.spec.model_dump(mode="json", exclude={"description"}),
                "pipeline_sha256": config_sha256(tune_file.pipeline, exclude=RUNTIME_SECTIONS)}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    guard = join_uri(sweep_uri, GUARD)
    if exists(guard):
        recorded = read_json(guard).get("sha256")
        if recorded != digest:
            raise ValueError(f"{tune_file.path}: the sweep folder {sweep_uri} holds a sweep of another tune file or "
                             "pipeline; give this sweep another name, or remove that folder to start afresh")
        return
    write_json_atomic(guard, {"sha256": digest, **identity})


def _tuner(tune_file: TuneFile, setup: TrialSetup, sweep_uri: str, experiment: str):
    """A new ``Tuner``, or the interrupted one restored from ``experiment``; (tuner, resumed)."""
    spec = tune_file.spec
    resources = {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu}
    trainable = tune.with_resources(tune.with_parameters(run_trial, setup=asdict(setup)), resources)
    if tune.Tuner.can_restore(experiment):
        damaged = damaged_state_files(experiment)
        if damaged:
            raise ValueError(f"{tune_file.path}: the sweep's saved state {damaged[0]} is cut short (the sweep was "
                             f"stopped while Ray Tune copied its state there), so it cannot resume; remove "
                             f"{experiment} to run the sweep afresh")
        return tune.Tuner.restore(experiment, trainable=trainable, resume_unfinished=True, restart_errored=True), True
    epochs = tune_file.reports
    concurrent = spaces.max_concurrent_trials(spec.resources, spec.max_concurrent_trials, ray.cluster_resources())
    tuner = tune.Tuner(
        trainable,
        param_space=spaces.param_space(spec.space),
        tune_config=tune.TuneConfig(
            metric=OBJECTIVE, mode="max", search_alg=spaces.search_algorithm(spec.search, concurrent),
            scheduler=spaces.scheduler(spec.scheduler, epochs), num_samples=spec.search.num_samples,
            reuse_actors=True, trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(name=EXPERIMENT, storage_path=sweep_uri, verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=spec.max_failures),
                                  callbacks=[TrialLines(epochs, spaces.trial_count(spec.space, spec.search.num_samples))]),
    )
    return tuner, False


def _rows(grid, space: list[str], epochs: int, candidates_uri: str) -> list[TrialRow]:
    """One ``TrialRow`` per trial of the result grid, in the grid's order (the order Tune created them)."""
    rows = []
    for result in grid:
        metrics = dict(result.metrics or {})
        trial_id = PurePosixPath(str(result.path)).name
        done = int(metrics.get(spaces.EPOCHS, 0))
        collapsed = metrics.get(COLLAPSED) or None
        outcome = ("error" if result.error is not None else "collapsed" if collapsed
                   else "finished" if done == epochs else "stopped")
        checkpoint = join_uri(candidates_uri, trial_id)
        rows.append(TrialRow(
            trial_id=trial_id, outcome=outcome, epochs=done, seconds=float(metrics.get("time_total_s", 0.0)),
            params={name: result.config.get(name) for name in space},
            metrics={k: float(metrics[k]) for k in REPORTED if metrics.get(k) is not None},
            checkpoint_uri=checkpoint if outcome == "finished" and checkpoint_exists(checkpoint) else None,
            collapsed=None if collapsed is None else str(collapsed),
        ))
    return rows
