"""The health check's defaults on the shipped digits pipelines: the first generation of each, trained
one epoch through the pipeline's own job (``PipelineRunner.generation_job``: its items, its
evaluation split for the sample, its health settings), is far above the floor (the numbers are the
ones docs/pipelines.md quotes). No Ray: the job runs in ``GenerationTraining`` directly."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from orchestrator.config import load_pipeline
from orchestrator.pipeline.runner import PipelineRunner
from orchestrator.training.generation import GenerationTraining
from orchestrator.training.health import retrieval_floor

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("pipeline", ["lifelong", "lifelong_euclidean", "quickstart", "binary_hyperbolic"])
def test_a_shipped_pipelines_first_generation_passes_after_one_epoch(pipeline, tmp_path):
    torch.set_num_threads(1)
    config = load_pipeline(REPO / "pipelines" / f"{pipeline}.yaml", {"storage": str(tmp_path / "run")})
    generation = config.generations[0]
    runner = PipelineRunner(config, progress=lambda line: None)
    job = runner.generation_job(generation, str(tmp_path / "g0"))
    job = dataclasses.replace(job, training={**job.training, "epochs": 1})
    session = GenerationTraining(job)
    monitor = session.watch_health()
    session.start()
    stop = session.check_health(0, session.train_epoch(0))
    assert stop is None
    own, chance = monitor.measured["health/own_cmc@1"], monitor.measured["health/chance"]
    floor = retrieval_floor(chance, len(monitor.sample), generation.health)
    assert own > 2 * floor, (own, chance, floor)  # 0.88 against a floor of 0.27 for lifelong's g0-old
