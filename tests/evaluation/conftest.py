"""The update experiment on the bundled digits shared by this folder's learning tests.

One old model on classes 0-4, the unaligned reference, and one new model per cosine method on all
ten classes, trained once per session (12 epochs, the library's default, seed 0) in two processes:
``run_update_experiment(workers=2)`` gives the weights of a single process
(``tests/evaluation/test_experiment_workers.py``, which also checks a mixed-geometry experiment).
HBCT (the one hyperbolic method here: its own old and reference models) is trained in a second
experiment only, at the shipped pipeline's budget (20 epochs, ``hbct_update``): at 12 epochs its mAP
margin over the old self-test is bimodal across seeds and CPUs (test_learning_compatibility.py), and
a 12-epoch copy would add three trainings that no test needs.
"""
from __future__ import annotations

import pytest

from orchestrator.evaluation.update_experiment import ExperimentSettings, UpdateExperiment, run_update_experiment
from orchestrator.training.config import TrainConfig

SETTINGS = ExperimentSettings(training=TrainConfig(epochs=12, batch_size=64, lr=0.05, augment=False, seed=0))
PIPELINE_BUDGET = ExperimentSettings(training=SETTINGS.training.model_copy(update={"epochs": 20}))
SECOND_TIER = ["lce", "unibct", "advbct"]  # share φ_o and φ_* with bct: one more training each
LEARNED_METHODS = ["independent", "bct", *SECOND_TIER, "fct"]


@pytest.fixture(scope="session")
def digits_experiment() -> UpdateExperiment:
    return UpdateExperiment(SETTINGS)


@pytest.fixture(scope="session")
def update(digits_experiment):
    return run_update_experiment(LEARNED_METHODS, experiment=digits_experiment, workers=2)


@pytest.fixture(scope="session")
def hbct_update():
    """HBCT's old, reference and new models at pipelines/lifelong.yaml's 20 epochs (seed 0)."""
    return run_update_experiment(["hbct"], experiment=UpdateExperiment(PIPELINE_BUDGET), workers=2)
