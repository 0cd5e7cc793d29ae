"""Experiment tracking of a pipeline run in MLflow (optional: the ``tracking`` extra).

``open_tracker(config, storage)`` gives a ``Tracker`` that does nothing when ``tracking.enabled`` is
false (MLflow is then never imported), else an ``MlflowTracker`` logging to ``tracking.uri``
(default ``sqlite:///<storage>/mlflow.db``) under the experiment ``tracking.experiment``:

- one MLflow run per ``orchestrator run`` invocation (named after the pipeline; tags: pipeline,
  config sha256): the pipeline's data / gallery / evaluation / search settings as parameters
  (secret-looking options masked), the compatibility matrices as metrics
  ``matrix/<metric>/<query>/<gallery>``, and the report files (JSON, CSV, PNG) as artifacts
  under ``reports/``;
- nested in it (tag ``mlflow.parentRunId``), one run per generation: the generation's settings as
  parameters (``method.name``, ``method.params.lam``, ``model.arch``, ``training.epochs``, ...),
  each epoch's losses and learning rate as metrics with ``step`` = epoch (when this invocation
  trains it), the checkpoint URI and sha256 as tags, its compatibility row ``self/<metric>``
  and ``cross/<metric>/<gallery>``, and the summary of its update ``update/<metric>/<self|cross|
  old_self|p_com|p_up|compatible>``.

Metric names drop the ``@`` of ``cmc@1`` (MLflow keys allow letters, digits, ``_ - . / :`` and
spaces): ``cmc1``, ``cmc5``, ``map``; undefined values (n/a) are not logged. Every run ends
FINISHED, or FAILED when the pipeline raised (KILLED when interrupted), with the error as tag
``error``. A run re-invoked after a failure or to resume makes new MLflow runs (the lineage, not
MLflow, decides what is redone). Once the runs exist, a failing MLflow call is reported through
``progress`` and the pipeline goes on: tracking never stops training.
"""
from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from orchestrator.config import GenerationSpec, PipelineConfig
from orchestrator.storage import is_local, read_bytes, redact_options, redact_uri

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install -e '.[tracking]'"
PARAM_MAX_CHARS = 6000  # MLflow's limit on a parameter value
BATCH = 100             # MLflow's limit on parameters / tags per log_batch call
PIPELINE_SECTIONS = {"data", "gallery", "evaluation", "search"}


class Tracker:
    """No tracking (``tracking.enabled`` false): every hook does nothing."""

    @contextlib.contextmanager
    def pipeline_run(self, config_sha256: str) -> Iterator[None]:
        """The pipeline's run, open while the body runs, ended by how the body ended."""
        yield

    def start_generation(self, generation: GenerationSpec) -> None:
        """Open the run of ``generation`` (before its first step) and log its settings."""

    def epoch_callback(self, generation: str) -> Callable[[dict[str, float]], None] | None:
        """What receives each finished epoch's metrics of ``generation`` (None: nothing does)."""
        return None

    def log_checkpoint(self, generation: str, uri: str | None, sha256: str | None) -> None:
        """The trained generation's checkpoint, as tags of its run."""

    def log_results(self, names: list[str], matrices: dict[str, np.ndarray],
                    updates: dict[str, dict[str, dict[str, Any]]], files: list[str]) -> None:
        """The compatibility matrices (query row, gallery column, in ``names`` order), each update's
        summary keyed by its new generation, and the report files' URIs."""


def open_tracker(config: PipelineConfig, storage: str, progress: Callable[[str], None]) -> Tracker:
    """The tracker ``config.tracking`` asks for; ImportError (one line, how to install) when it is
    enabled and MLflow is missing. ``storage``: the pipeline's storage root (absolute when local)."""
    if not config.tracking.enabled:
        return Tracker()
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as error:
        raise ImportError(f"tracking.enabled is true but MLflow is not installed: {INSTALL_HINT}") from error
    uri = config.tracking.uri
    if uri.startswith("sqlite:///") and uri != "sqlite:///:memory:":  # SQLite makes the file, not its folder
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    try:
        client = MlflowClient(tracking_uri=uri)  # opens (and migrates) a SQL store now
    except Exception as error:  # noqa: BLE001 - MLflow's own errors: one line, before anything runs
        raise store_error(uri, error) from error
    return MlflowTracker(client, config, storage, progress)


def store_error(uri: str, error: Exception) -> RuntimeError:
    """The one-line error of a tracking store that cannot be used."""
    return RuntimeError(f"tracking: could not start an MLflow run at {shown_uri(uri)}: "
                        f"{type(error).__name__}: {' '.join(str(error).split())[:300]}")


class MlflowTracker(Tracker):
    """Logs to MLflow through one ``MlflowClient`` (see the module docstring for what goes where)."""

    def __init__(self, client: Any, config: PipelineConfig, storage: str, progress: Callable[[str], None]):
        self.client, self.config, self.storage, self.progress = client, config, storage, progress
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.generation_runs: dict[str, str] = {}

    @contextlib.contextmanager
    def pipeline_run(self, config_sha256: str) -> Iterator[None]:
        try:
            self.experiment_id = self._experiment_id()
            run = self.client.create_run(self.experiment_id, run_name=self.config.name, tags={
                "orchestrator.pipeline": self.config.name, "orchestrator.config_sha256": config_sha256})
        except Exception as error:  # noqa: BLE001 - MLflow's own errors: one line, before anything ran
            raise store_error(self.config.tracking.uri, error) from error
        self.run_id = run.info.run_id
        self.progress(f"tracking: MLflow run {self.run_id} of experiment {self.config.tracking.experiment!r} at "
                      f"{shown_uri(self.config.tracking.uri)}")
        settings = redact_options(self.config.model_dump(mode="json", include=PIPELINE_SECTIONS))
        self._guarded("log the pipeline's settings", self._log_params, self.run_id, flat_params(settings))
        try:
            yield
        except BaseException as error:
            status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
            text = " ".join(f"{type(error).__name__}: {error}".split())[:500]
            self._guarded("record the error", self.client.set_tag, self.run_id, "error", text)
            self._end_all(status)
            raise
        self._end_all("FINISHED")

    def start_generation(self, generation: GenerationSpec) -> None:
        def start() -> None:
            run = self.client.create_run(self.experiment_id, run_name=generation.name, tags={
                "mlflow.parentRunId": self.run_id, "orchestrator.pipeline": self.config.name,
                "orchestrator.generation": generation.name, "orchestrator.parent": generation.parent or ""})
            self.generation_runs[generation.name] = run.info.run_id
            self._log_params(run.info.run_id, flat_params(generation.model_dump(mode="json", exclude={"name"})))
        self._guarded(f"open the run of generation {generation.name}", start)

    def epoch_callback(self, generation: str) -> Callable[[dict[str, float]], None] | None:
        def log_epoch(metrics: dict[str, float]) -> None:
            run_id = self.generation_runs.get(generation)
            if run_id is not None:
                self._guarded(f"log an epoch of {generation}", self._log_metrics, run_id,
                              epoch_metrics(metrics), int(metrics["epoch"]))
        return log_epoch

    def log_checkpoint(self, generation: str, uri: str | None, sha256: str | None) -> None:
        run_id = self.generation_runs.get(generation)
        if run_id is not None and uri is not None:
            tags = {"checkpoint_uri": redact_uri(uri), "checkpoint_sha256": sha256 or ""}
            self._guarded(f"tag the checkpoint of {generation}", self._log_tags, run_id, tags)

    def log_results(self, names: list[str], matrices: dict[str, np.ndarray],
                    updates: dict[str, dict[str, dict[str, Any]]], files: list[str]) -> None:
        self._guarded("log the compatibility matrices", self._log_metrics, self.run_id, matrix_metrics(names, matrices), 0)
        for i, name in enumerate(names):
            run_id = self.generation_runs.get(name)
            if run_id is not None:
                values = {**row_metrics(names, i, matrices), **update_metrics(updates.get(name, {}))}
                self._guarded(f"log the compatibility of {name}", self._log_metrics, run_id, values, 0)
        self._guarded("upload the report files", self._log_files, files)

    # --- MLflow calls --------------------------------------------------------------------------
    def _experiment_id(self) -> str:
        """The configured experiment, created on first use; with SQLite tracking and a local
        storage its artifacts go under ``<storage>/mlflow-artifacts`` (else the store's default)."""
        name = self.config.tracking.experiment
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        location = None
        if self.config.tracking.uri.startswith("sqlite:") and is_local(self.storage):
            location = Path(self.storage, "mlflow-artifacts").resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=location)

    def _log_params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(key, value) for key, value in params.items()]
        for start in range(0, len(items), BATCH):
            self.client.log_batch(run_id, params=items[start:start + BATCH])

    def _log_tags(self, run_id: str, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(key, value) for key, value in tags.items()])

    def _log_metrics(self, run_id: str, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(metric_key(key), value, now, step) for key, value in values.items()]
        for start in range(0, len(items), 1000):  # MLflow's limit on metrics per call
            self.client.log_batch(run_id, metrics=items[start:start + 1000])

    def _log_files(self, files: list[str]) -> None:
        """The report files under ``reports/`` of the pipeline's run (read through the storage
        layer, so object storage works the same)."""
        with tempfile.TemporaryDirectory() as folder:
            for uri in files:
                Path(folder, uri.rstrip("/").rsplit("/", 1)[-1]).write_bytes(read_bytes(uri))
            self.client.log_artifacts(self.run_id, folder, artifact_path="reports")

    def _end_all(self, status: str) -> None:
        for run_id in [*self.generation_runs.values(), self.run_id]:
            self._guarded(f"end run {run_id}", self.client.set_terminated, run_id, status)

    def _guarded(self, what: str, action: Callable[..., Any], *args: Any) -> None:
        """``action(*args)``; an error is reported (one line) instead of stopping the pipeline."""
        try:
            action(*args)
        except Exception as error:  # noqa: BLE001 - tracking must not stop training
            log.debug("tracking failed", exc_info=True)
            self.progress(f"tracking: could not {what}: {type(error).__name__}: {' '.join(str(error).split())[:300]}")


# --- what is logged ------------------------------------------------------------------------------
def shown_uri(uri: str) -> str:
    """A tracking URI safe to print: a server's or database's ``user:password@`` masked (a SQLite
    path has none, and stays as given)."""
    return uri if uri.startswith("sqlite:") else redact_uri(uri)


def metric_key(*parts: str) -> str:
    """An MLflow metric name: ``parts`` joined by ``/``, without the ``@`` of ``cmc@1``."""
    return "/".join(parts).replace("@", "")


def flat_params(settings: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested settings as MLflow parameters: dotted keys, values as JSON text (strings as they
    are), cut to MLflow's limit."""
    params: dict[str, str] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            params.update(flat_params(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            params[name] = text if len(text) <= PARAM_MAX_CHARS else text[:PARAM_MAX_CHARS - 3] + "..."
    return params


def epoch_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """An epoch's reported values but its number (the step it is logged at)."""
    return {key: float(value) for key, value in metrics.items()
            if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool)}


def matrix_metrics(names: list[str], matrices: dict[str, np.ndarray]) -> dict[str, float]:
    """``matrix/<metric>/<query>/<gallery>`` for every defined cell."""
    return {metric_key("matrix", metric, query, gallery): float(matrix[i, j])
            for metric, matrix in matrices.items() for i, query in enumerate(names)
            for j, gallery in enumerate(names) if not np.isnan(matrix[i, j])}


def row_metrics(names: list[str], i: int, matrices: dict[str, np.ndarray]) -> dict[str, float]:
    """Generation ``names[i]``'s queries: ``self/<metric>`` on its own gallery, ``cross/<metric>/<gallery>``
    on each other generation's."""
    values = {}
    for metric, matrix in matrices.items():
        for j, gallery in enumerate(names):
            if not np.isnan(matrix[i, j]):
                key = metric_key("self", metric) if i == j else metric_key("cross", metric, gallery)
                values[key] = float(matrix[i, j])
    return values


def update_metrics(summary: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``update/<metric>/<value>`` of one update's summary (``compatible`` as 1 / 0; n/a left out)."""
    values = {}
    for metric, numbers in summary.items():
        for name, value in numbers.items():
            if isinstance(value, bool):
                values[metric_key("update", metric, name)] = float(value)
            elif isinstance(value, (int, float)) and not np.isnan(value):
                values[metric_key("update", metric, name)] = float(value)
    return values
