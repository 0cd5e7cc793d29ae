"""Shared by the sweep tests: one local Ray (2 CPUs) and one small pipeline whose parent and
reference the first sweep trains through the pipeline's steps; later sweeps on the same storage
reuse them (their ``train:`` steps are committed)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
import ray.tune
import yaml

from benchmarks import tune_asha_vs_grid
from local_ray import start_local_ray
from orchestrator.distributed.runtime import WORKER_ENV_VARS
from orchestrator.tuning.trial import TrialSetup, run_trial

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def bench():
    """The ASHA-against-grid benchmark's module (its pipeline builder is the tests' too)."""
    return tune_asha_vs_grid


@pytest.fixture(scope="session")
def ray_address():
    yield start_local_ray(runtime_env={"env_vars": WORKER_ENV_VARS})
    ray.shutdown()


@dataclass(frozen=True)
class SmallPipeline:
    folder: Path
    pipeline: Path
    storage: Path

    def tune_file(self, name: str, **fields) -> Path:
        """A tune file for g0-old → g1 of the small pipeline (``fields`` override the defaults)."""
        spec = {"name": name, "pipeline": str(self.pipeline), "transition": {"parent": "g0-old", "candidate": "g1"},
                "objective": {"maximize": "cross_map"}, **fields}
        path = self.folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path


@pytest.fixture(scope="session")
def small(tmp_path_factory, bench, ray_address) -> SmallPipeline:
    """lifelong.yaml without g2, every generation 3 epochs, storage in a temporary folder; the
    pipeline's own train steps run in the driver (``ray.num_workers`` 0, Ray Train's local mode)."""
    folder = tmp_path_factory.mktemp("tuning")
    pipeline = bench.pipeline_file(REPO / "pipelines" / "lifelong.yaml", folder, folder / "run", epochs=3)
    config = yaml.safe_load(pipeline.read_text())
    config["ray"]["num_workers"] = 0
    pipeline.write_text(yaml.safe_dump(config, sort_keys=False))
    return SmallPipeline(folder, pipeline, folder / "run")


@pytest.fixture
def trial_here(monkeypatch):
    """``trial_here(job, candidates_uri, config)``: one Tune trial of ``job`` (a ``GenerationJob``)
    run in this process by ``run_trial``, its objective the cross-test mAP on 100 test digits;
    returns the metrics it reported, in order (``ray.tune.report`` captured)."""
    def run(job, candidates_uri: str, config: dict) -> list[dict]:
        setup = TrialSetup(job=asdict(job), eval_source="digits", eval_options={"split": "test"}, image_size=32,
                           reference_self=None, objective={"maximize": "cross_map"},
                           candidates_uri=candidates_uri, eval_sample=100)
        reports: list[dict] = []
        monkeypatch.setattr(ray.tune, "report", lambda metrics: reports.append(metrics))
        monkeypatch.setattr(ray.tune, "get_context", lambda: SimpleNamespace(get_trial_id=lambda: "t1"))
        run_trial(config, asdict(setup))
        return reports
    return run
