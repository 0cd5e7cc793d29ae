"""``run_update_experiment(workers=N)`` trains in N spawned processes and gets the weights and the
report of one process: every training is seeded from its own inputs, whichever process runs it.
An entry's ``old_params`` reach its old model and nothing else."""
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


def test_old_params_reach_the_old_model_only():
    # the paper's HBCT; the same with the learned logit scale on its old model only; HBCT t throughout
    # (uncapped, so that its old model is the second row's: the ceiling is the paper row's 100)
    paper = {"mlr_learn_scale": False, "mlr_max_scale": 100.0}
    methods = [("hbct", paper), ("hbct", paper, {"mlr_learn_scale": True}), ("hbct", {"mlr_max_scale": 100.0})]
    result = run_update_experiment(methods, experiment=small_experiment(), workers=1)
    labels = ("hbct", "hbct#1", "hbct#2")
    (paper_old, paper_ref), (old, ref), (t_old, t_ref) = (result.generations[label] for label in labels)
    # φ_* follows the new model's params: the paper's; the old model is HBCT t's old model (one training)
    assert (ref, old) == (paper_ref, t_old) and len({paper_old, old, paper_ref, t_ref}) == 4
    heads = {name: result.models[name].head for name in (paper_old, old, ref, "hbct", "hbct#1", "hbct#2")}
    learned = {name for name, head in heads.items() if head.log_scale is not None}
    assert learned == {old, "hbct#2"}
    assert heads[old].log_scale.item() != 0.0  # trained, from log t = 0
    assert result.models[old].encoder.lift.clip == pytest.approx(1.0)  # still the parent's ζ_o = ζ_n − 0.2
    assert result.summaries["hbct#1"] != result.summaries["hbct"]
    with pytest.raises(ValueError, match="mlr_learn_scal"):
        run_update_experiment([("hbct", {}, {"mlr_learn_scal": True})], experiment=small_experiment())
