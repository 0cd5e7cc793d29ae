"""Experiment tracking in MLflow (``orchestrator.pipeline.tracking``), read back from a real local
MLflow store (SQLite under tmp_path) with ``MlflowClient``:

- the ``tracking`` section: defaults (URI under the storage, experiment = pipeline name), a
  required URI with remote storage, a bad URI refused; it changes neither the run's identity
  (config sha256) nor a step's spec;
- without tracking nothing imports MLflow, and a file that enables it without MLflow installed
  gets a one-line error saying how to install it;
- the tracker's runs: the pipeline's run and a nested run per generation, their parameters, the
  per-epoch metric history, checkpoint tags, compatibility and update metrics (against the numbers
  given), the report files as artifacts byte for byte, FINISHED / FAILED;
- end to end (e2e): a two-generation pipeline run through the CLI with tracking on and the Ray
  dashboard asked for: the store holds what the lineage holds.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient

from cli_runs import cli
from g0_run import g0_config, write_pipeline
from orchestrator.config import RUNTIME_SECTIONS, PipelineConfigError, config_sha256, load_pipeline
from orchestrator.distributed.runtime import dashboard_address
from orchestrator.lineage import LineageStore
from orchestrator.metrics import METRICS
from orchestrator.pipeline.report import write_report
from orchestrator.pipeline.step_specs import train_spec
from orchestrator.pipeline.tracking import Tracker, metric_key, open_tracker, shown_uri

REPO = Path(__file__).resolve().parents[2]
LIFELONG = REPO / "pipelines" / "lifelong.yaml"


def tracked(tmp_path: Path, **overrides):
    return load_pipeline(LIFELONG, {"storage": str(tmp_path / "run"), "tracking.enabled": True, **overrides})


def runs_by_name(client: MlflowClient, experiment: str) -> dict[str, object]:
    found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return {run.info.run_name: run for run in found}


# --------------------------------------------------------------------------- the tracking section


def test_defaults_follow_the_storage_and_the_pipeline_name(tmp_path):
    config = tracked(tmp_path)
    assert config.tracking.uri == f"sqlite:///{tmp_path / 'run'}/mlflow.db"
    assert config.tracking.experiment == "lifelong"
    given = tracked(tmp_path, **{"tracking.uri": "http://127.0.0.1:5000", "tracking.experiment": "team/x"})
    assert (given.tracking.uri, given.tracking.experiment) == ("http://127.0.0.1:5000", "team/x")


def test_remote_storage_needs_a_uri_only_when_tracking_is_on():
    remote = {"storage": "s3://bucket/runs", "lineage": "sqlite:///l.db"}
    assert load_pipeline(LIFELONG, remote).tracking.uri is None  # off: nothing needed
    with pytest.raises(PipelineConfigError) as error:
        load_pipeline(LIFELONG, {**remote, "tracking.enabled": True})
    assert "tracking.uri: required with remote storage (s3://bucket/runs)" in str(error.value)
    with pytest.raises(PipelineConfigError) as error:
        load_pipeline(LIFELONG, {"tracking.uri": "ftp://host/x"})
    assert "tracking.uri: expected an MLflow tracking URI" in str(error.value) and "ftp://host/x" in str(error.value)


def test_tracking_changes_neither_the_run_identity_nor_a_step_spec(tmp_path):
    plain = load_pipeline(LIFELONG, {"storage": str(tmp_path / "run")})
    other = tracked(tmp_path, **{"tracking.uri": "sqlite:///elsewhere.db", "ray.dashboard": True})
    assert config_sha256(plain, exclude=RUNTIME_SECTIONS) == config_sha256(other, exclude=RUNTIME_SECTIONS)
    assert config_sha256(plain) != config_sha256(other)  # the sections are in the file's own hash
    for mine, theirs in zip(plain.generations, other.generations):
        assert train_spec(plain, mine, "sha") == train_spec(other, theirs, "sha")


def test_without_tracking_mlflow_is_never_imported_and_enabling_it_without_mlflow_says_how_to_install():
    script = f"""
import sys
sys.modules["mlflow"] = None  # as if MLflow were not installed: importing it raises ImportError
from orchestrator.config import load_pipeline
from orchestrator.pipeline.tracking import Tracker, open_tracker
import orchestrator.pipeline.runner, orchestrator.cli
config = load_pipeline({str(LIFELONG)!r})
assert type(open_tracker(config, "runs/x", print)) is Tracker
try:
    open_tracker(load_pipeline({str(LIFELONG)!r}, {{"tracking.enabled": True}}), "runs/x", print)
except ImportError as error:
    print("ERROR", error)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == (
        "ERROR tracking.enabled is true but MLflow is not installed: pip install -e '.[tracking]'")


def test_dashboard_address():
    assert dashboard_address("127.0.0.1:8265") == "http://127.0.0.1:8265"
    assert dashboard_address("https://head:8265") == "https://head:8265"
    assert dashboard_address("") is None and dashboard_address(None) is None


# --------------------------------------------------------------------------- the tracker


def test_disabled_tracker_does_nothing(tmp_path):
    config = load_pipeline(LIFELONG, {"storage": str(tmp_path / "run")})
    tracker = open_tracker(config, str(tmp_path / "run"), print)
    assert type(tracker) is Tracker and tracker.epoch_callback("g1") is None
    with tracker.pipeline_run("sha"):
        tracker.start_generation(config.generations[0])
    assert not (tmp_path / "run").exists()


def test_a_tracked_run_reads_back_from_the_store(tmp_path):
    config = tracked(tmp_path)
    storage = str(tmp_path / "run")
    lines: list[str] = []
    tracker = open_tracker(config, storage, lines.append)
    g0, g1 = config.generations[:2]
    names = [g0.name, g1.name]
    rng = np.random.default_rng(7)
    matrices = {metric: rng.uniform(size=(2, 2)) for metric in METRICS}
    for matrix in matrices.values():
        matrix[0, 1] = np.nan  # an old model's queries are never scored on a newer gallery
    update = {"map": {"self": 0.8, "cross": 0.6, "old_self": 0.5, "p_com": None, "p_up": 0.25, "compatible": True}}
    files = write_report(str(tmp_path / "reports"), names, [], {"g0-old → g1": update})
    epochs = [{"epoch": e, "loss": 2.0 - e / 2, "loss/base": 1.5 - e / 4, "lr": 0.05 / (e + 1), "start_epoch": 0,
               "health/own_cmc@1": 0.3 + e / 10} for e in range(3)]

    with tracker.pipeline_run("c0ffee"):
        for generation in (g0, g1):
            tracker.start_generation(generation)
        for metrics in epochs:
            tracker.epoch_callback(g1.name)(metrics)
        tracker.log_checkpoint(g1.name, str(tmp_path / "run" / "generations" / "g1"), "ab" * 32)
        tracker.log_results(names, matrices, {g1.name: update}, files)

    assert not [line for line in lines if "could not" in line], lines
    client = MlflowClient(tracking_uri=config.tracking.uri)
    runs = runs_by_name(client, "lifelong")
    assert set(runs) == {"lifelong", "g0-old", "g1"}
    pipeline, child = runs["lifelong"], runs["g1"]
    assert {run.info.status for run in runs.values()} == {"FINISHED"}
    assert pipeline.data.tags["orchestrator.config_sha256"] == "c0ffee"
    assert child.data.tags["mlflow.parentRunId"] == pipeline.info.run_id == runs["g0-old"].data.tags["mlflow.parentRunId"]
    assert pipeline.data.params["data.source"] == "digits" and pipeline.data.params["gallery.num_shards"] == "4"

    params = child.data.params
    assert params["method.name"] == "hbct" and float(params["method.params.clip"]) == g1.method.params["clip"]
    assert params["model.arch"] == g1.model.arch and int(params["training.epochs"]) == g1.training.epochs
    assert params["parent"] == "g0-old" and params["backfill.policy"] == "partial"

    for key in ("loss", "loss/base", "lr"):
        history = sorted(client.get_metric_history(child.info.run_id, key), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == [(e["epoch"], pytest.approx(e[key])) for e in epochs]
    assert client.get_metric_history(runs["g0-old"].info.run_id, "loss") == []  # not trained here
    health = sorted(client.get_metric_history(child.info.run_id, "health/own_cmc1"), key=lambda m: m.step)
    assert [m.value for m in health] == [pytest.approx(e["health/own_cmc@1"]) for e in epochs]  # the @ dropped

    assert child.data.tags["checkpoint_uri"].endswith("generations/g1")
    assert child.data.tags["checkpoint_sha256"] == "ab" * 32
    for metric, matrix in matrices.items():
        key = metric.replace("@", "")
        assert child.data.metrics[f"self/{key}"] == pytest.approx(matrix[1, 1])
        assert child.data.metrics[f"cross/{key}/g0-old"] == pytest.approx(matrix[1, 0])
        assert runs["g0-old"].data.metrics[f"self/{key}"] == pytest.approx(matrix[0, 0])
        assert f"cross/{key}/g1" not in runs["g0-old"].data.metrics  # n/a is not logged
        assert pipeline.data.metrics[f"matrix/{key}/g1/g0-old"] == pytest.approx(matrix[1, 0])
    assert {k: v for k, v in child.data.metrics.items() if k.startswith("update/")} == {
        "update/map/self": 0.8, "update/map/cross": 0.6, "update/map/old_self": 0.5, "update/map/p_up": 0.25,
        "update/map/compatible": 1.0}

    logged = {Path(a.path).name for a in client.list_artifacts(pipeline.info.run_id, "reports")}
    assert logged == {Path(f).name for f in files} and "compatibility.json" in logged
    local = Path(client.download_artifacts(pipeline.info.run_id, "reports/compatibility.json", str(tmp_path / "dl")))
    assert json.loads(local.read_text()) == json.loads(Path(files[0]).read_text())
    assert str(tmp_path / "run" / "mlflow-artifacts") in pipeline.info.artifact_uri


def test_a_failing_pipeline_ends_its_runs_failed_with_the_error(tmp_path):
    config = tracked(tmp_path)
    tracker = open_tracker(config, str(tmp_path / "run"), print)
    with pytest.raises(ValueError, match="boom"):
        with tracker.pipeline_run("sha"):
            tracker.start_generation(config.generations[0])
            raise ValueError("boom\nsecond line")
    runs = runs_by_name(MlflowClient(tracking_uri=config.tracking.uri), "lifelong")
    assert {name: run.info.status for name, run in runs.items()} == {"lifelong": "FAILED", "g0-old": "FAILED"}
    assert runs["lifelong"].data.tags["error"] == "ValueError: boom second line"


def test_an_unreachable_store_fails_before_anything_runs_and_a_later_failure_does_not_stop_the_run(tmp_path):
    (tmp_path / "garbage.db").write_bytes(b"not a database" * 100)
    config = tracked(tmp_path, **{"tracking.uri": f"sqlite:///{tmp_path / 'garbage.db'}"})
    with pytest.raises(RuntimeError, match=r"^tracking: could not start an MLflow run at sqlite:///.*garbage.db: "):
        open_tracker(config, str(tmp_path / "run"), print)
    config = tracked(tmp_path)
    lines: list[str] = []
    tracker = open_tracker(config, str(tmp_path / "run"), lines.append)
    with tracker.pipeline_run("sha"):
        tracker.start_generation(config.generations[0])
        tracker.log_results(["g0-old"], {"map": np.ones((1, 1))}, {}, [str(tmp_path / "missing.json")])
    assert any(line.startswith("tracking: could not upload the report files: FileNotFoundError") for line in lines)
    assert runs_by_name(MlflowClient(tracking_uri=config.tracking.uri), "lifelong")["lifelong"].info.status == "FINISHED"


def test_metric_keys_drop_the_at_sign_and_printed_uris_hide_passwords():
    assert metric_key("cross", "cmc@1", "g0-old") == "cross/cmc1/g0-old"
    assert shown_uri("postgresql://ml:s3cret@db:5432/mlflow") == "postgresql://***@db:5432/mlflow"
    assert shown_uri("sqlite:////abs/run/mlflow.db") == "sqlite:////abs/run/mlflow.db"


# --------------------------------------------------------------------------- end to end


@pytest.mark.e2e
def test_a_pipeline_run_with_tracking_and_the_dashboard(tmp_path, copy_g0_run):
    """g1 (2 epochs) trained over the session's served g0-old run (copied, trained untracked):
    both generations get a run; g0-old's, skipped, has its checkpoint and scores but no epochs."""
    copy_g0_run(tmp_path)
    config = g0_config()
    g1 = next(g for g in yaml.safe_load(LIFELONG.read_text())["generations"] if g["name"] == "g1")
    config["generations"].append({**g1, "training": {**g1["training"], "epochs": 2}, "gate": {"action": "force"}})
    config["evaluation"] = {"reference": None, "backfill_curves": False}
    config["ray"]["dashboard"] = True
    config["tracking"] = {"enabled": True}
    pipeline = write_pipeline(tmp_path / "tracked.yaml", config, tmp_path / "run")

    done = cli("run", str(pipeline), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Ray dashboard: http://127.0.0.1:" in done.stdout
    assert "tracking: MLflow run" in done.stdout and "could not" not in done.stdout

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    runs = runs_by_name(client, "lifelong")
    assert set(runs) == {"lifelong", "g0-old", "g1"} and {r.info.status for r in runs.values()} == {"FINISHED"}
    store = LineageStore(f"sqlite:///{tmp_path / 'run' / 'lineage.db'}")
    values = {(v.query, v.gallery, v.metric): v.value for v in store.compatibility_values(dataset="test")}
    for name, epochs in (("g0-old", 1), ("g1", 2)):
        run, record = runs[name], store.get_generation(name)
        history = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
        if name == "g1":
            assert [m.step for m in history] == list(range(epochs))
            assert history[-1].value == pytest.approx(record.metrics["loss"])  # the last epoch's loss, as recorded
        else:
            assert history == []  # trained before tracking was on: its skipped step logs no epoch
        assert run.data.tags["checkpoint_uri"] == record.checkpoint_uri
        assert run.data.tags["checkpoint_sha256"] == record.sha256
        assert run.data.params["method.name"] == "hbct" and run.data.params["training.epochs"] == str(epochs)
        assert run.data.metrics["self/map"] == pytest.approx(values[(name, name, "map")])
    assert runs["g1"].data.metrics["cross/map/g0-old"] == pytest.approx(values[("g1", "g0-old", "map")])
    summary = json.loads((tmp_path / "run" / "reports" / "compatibility.json").read_text())["updates"]["g0-old → g1"]
    assert runs["g1"].data.metrics["update/map/cross"] == pytest.approx(summary["map"]["cross"])
    artifacts = {Path(a.path).name for a in client.list_artifacts(runs["lifelong"].info.run_id, "reports")}
    assert {"compatibility.json", "compatibility.csv", "compatibility_map.png"} <= artifacts
    store.close()
