"""``run_update_experiment(workers=N)`` trains in N processes (forks of a fork server) and gets the
weights and the report of one process: every training is seeded from its own inputs, whichever
process runs it. The processes see this process's environment as it is when they start. An entry's
``old_params`` reach its old model and nothing else."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from orchestrator.data import load_digits
from orchestrator.evaluation.update_experiment import (
    ExperimentSettings,
    UpdateExperiment,
    _trainer_pool,
    run_update_experiment,
)
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
    # each geometry has its own old and reference models; a hyperbolic and a cosine generation
    # share no distance, so their cross pair is noted, not evaluated
    (old_bct, ref_bct), (old_hbct, ref_hbct) = serial.generations["bct"], serial.generations["hbct"]
    assert old_bct != old_hbct and ref_bct != ref_hbct
    assert ("hbct", old_bct) in serial.report.notes


def test_trainers_see_the_environment_of_their_pools_start(monkeypatch):
    """A fork server starts once per process, with the environment of that moment; the trainers it
    forks for a later pool still see the environment as that pool starts (as spawned ones would,
    e.g. ``ORCHESTRATOR_PLUGINS`` set after an earlier experiment)."""
    with _trainer_pool(2) as first:
        assert first.submit(os.getenv, "ORCHESTRATOR_TEST_MARK").result() is None
    monkeypatch.setenv("ORCHESTRATOR_TEST_MARK", "set after the first pool")
    with _trainer_pool(2) as second:
        assert second.submit(os.getenv, "ORCHESTRATOR_TEST_MARK").result() == "set after the first pool"


def test_a_kept_result_holds_no_descriptor_per_tensor():
    """Tensors that crossed between processes live in shared memory, an open file descriptor each
    (torch's sharing); a result returns its models in this process's own memory (one bct experiment
    held 285 descriptors, and a session keeping a few results passed the usual limit of 1,024)."""
    before = len(os.listdir("/proc/self/fd"))
    result = run_update_experiment(["bct"], experiment=small_experiment(), workers=2)
    shared = [(name, key) for name, model in result.models.items()
              for key, tensor in model.state_dict(keep_vars=True).items() if tensor.is_shared()]
    assert shared == []
    assert len(os.listdir("/proc/self/fd")) - before < 20  # the fork server's pipes at most


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


def test_a_fine_tuned_entry_starts_from_its_old_model_and_every_training_is_timed():
    """``(name, params, old_params, True)``: the new model starts from its old model's weights. With
    a learning rate of ~0 it ends there (l2: an encoder test_resnet whose BatchNorm statistics move
    in training mode is compared on the weights alone); the same entry without the flag does not."""
    experiment = small_experiment()
    still = experiment.settings.model_copy(update={"training": experiment.settings.training.model_copy(
        update={"lr": 1e-12, "momentum": 0.0, "weight_decay": 0.0})})
    experiment.settings = still
    result = run_update_experiment([("l2", {}, {}, True), ("l2", {}, {})], experiment=experiment, workers=1)
    old, _ = result.generations["l2"]
    parent = result.models[old].state_dict()
    weights = [k for k, v in parent.items() if v.is_floating_point() and "running_" not in k]
    started, fresh = result.models["l2"].state_dict(), result.models["l2#1"].state_dict()
    assert weights and all(torch.allclose(started[k], parent[k], atol=1e-6) for k in weights)
    assert not all(torch.allclose(fresh[k], parent[k], atol=1e-6) for k in weights)
    assert torch.equal(result.models["l2"].seen_classes, result.models["l2#1"].seen_classes)  # its own classes
    assert set(result.train_seconds) == set(result.models) and all(s > 0 for s in result.train_seconds.values())


def test_fine_tuning_needs_the_old_models_architecture():
    experiment = small_experiment()
    experiment.settings = experiment.settings.model_copy(update={"new_arch": "test_convnext"})
    with pytest.raises(ValueError, match="l2: init_from_parent needs the old model's architecture"):
        run_update_experiment([("l2", {}, {}, True)], experiment=experiment, workers=1)
