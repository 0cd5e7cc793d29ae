"""``run_update_experiment(workers=N)`` trains in N spawned processes and gets the weights and the
report of one process: every training is seeded from its own inputs, whichever process runs it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrator.data import load_digits
from orchestrator.evaluation.update_experiment import ExperimentSettings, UpdateExperiment, run_update_experiment
from orchestrator.training.config import TrainConfig


def small_experiment() -> UpdateExperiment:
    rng = np.random.default_rng(0)
    train, test = load_digits("train"), load_digits("test")
    return UpdateExperiment(
        ExperimentSettings(embed_dim=8, image_size=16,
                           training=TrainConfig(epochs=1, batch_size=32, lr=0.05, augment=False, seed=3)),
        train_images=train.subset(np.sort(rng.choice(len(train), 160, replace=False))),
        eval_images=test.subset(np.sort(rng.choice(len(test), 60, replace=False))))


def test_two_processes_train_the_same_models_as_one():
    # bct: cosine old/reference shared; hbct: Lorentz geometry; advbct: training-only auxiliary modules
    methods = ["bct", "hbct", "advbct"]
    serial = run_update_experiment(methods, experiment=small_experiment(), workers=1)
    parallel = run_update_experiment(methods, experiment=small_experiment(), workers=2)
    assert serial.generations == parallel.generations
    assert set(serial.models) == set(parallel.models) == {
        *methods, *(name for pair in serial.generations.values() for name in pair)}
    for name, model in serial.models.items():
        expected, got = model.state_dict(), parallel.models[name].state_dict()
        assert expected.keys() == got.keys(), name
        for key in expected:
            assert torch.equal(expected[key], got[key]), f"{name}: {key} differs"
    assert serial.summaries == parallel.summaries


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"):
        run_update_experiment(["bct"], experiment=small_experiment(), workers=0)
