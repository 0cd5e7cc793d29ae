"""The training health rule (``orchestrator.training.health``): chance level against an independent
computation, the floor, the one-line verdicts, and the check on real short trainings of the digits
(a healthy one passes and trains bit for bit as without the check; one that learns nothing stops)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from orchestrator.data import load_digits
from orchestrator.evaluation.update_experiment import ExperimentSettings, UpdateExperiment
from orchestrator.methods import create_method
from orchestrator.metrics import retrieval_metrics
from orchestrator.training.config import HealthSpec, TrainConfig
from orchestrator.training.health import (
    HealthMonitor,
    TrainingUnhealthy,
    chance_cmc1,
    health_sample,
    judge_fit,
    judge_loss,
    judge_retrieval,
    judged_from,
    own_cmc1,
    retrieval_floor,
)

SPEC = HealthSpec()


def test_chance_is_the_leave_one_out_expectation_by_hand():
    assert chance_cmc1([0, 0, 1]) == pytest.approx(1 / 3)  # the 0s find the other 0 half the time, the 1 never
    assert chance_cmc1([0, 0, 0]) == 1.0 and chance_cmc1([0, 1, 2, 3]) == 0.0
    assert math.isnan(chance_cmc1([5]))
    labels = np.repeat(np.arange(10), 50)  # balanced: (n_c - 1)/(n - 1)
    assert chance_cmc1(labels) == pytest.approx(49 / 499)


def test_chance_and_its_spread_match_random_embeddings_monte_carlo():
    """Independent computation: the CMC@1 of random Gaussian embeddings, leave-one-out, averaged over
    many draws, on unbalanced labels; its spread is the binomial σ the floor uses."""
    labels = np.concatenate([np.full(n, c) for c, n in enumerate([120, 60, 40, 40, 20, 10, 10])])
    ids = np.arange(labels.size)
    generator = torch.Generator().manual_seed(1)
    draws = []
    for _ in range(200):
        embedding = torch.randn(labels.size, 16, generator=generator)
        draws.append(retrieval_metrics(embedding, embedding, labels, labels, "cosine", ks=(1,),
                                       query_ids=ids, gallery_ids=ids).cmc[1])
    draws = np.array(draws)
    chance = chance_cmc1(labels)
    sigma = math.sqrt(chance * (1 - chance) / labels.size)
    assert abs(draws.mean() - chance) < 3 * draws.std() / math.sqrt(len(draws))
    assert draws.std() == pytest.approx(sigma, rel=0.25)
    floor = retrieval_floor(chance, labels.size, SPEC)
    assert (draws >= floor).mean() <= 0.01  # random rankings (almost) never pass the floor (3σ: 0.13 %)


def test_the_floor_is_chance_plus_the_larger_of_margin_and_sigmas_at_most_halfway():
    chance = 49 / 499  # the digits' test split, 10 classes, 500 items
    sigma = math.sqrt(chance * (1 - chance) / 500)
    assert retrieval_floor(chance, 500, SPEC) == pytest.approx(chance + 3 * sigma)  # 0.138
    assert retrieval_floor(chance, 500, SPEC) == pytest.approx(0.1381, abs=5e-4)
    assert retrieval_floor(0.01, 10_000, SPEC) == pytest.approx(0.01 + 0.02)  # the margin when σ is tiny
    assert retrieval_floor(0.5, 10, SPEC) == pytest.approx(0.75)  # two classes, few items: halfway
    assert retrieval_floor(chance, 500, HealthSpec(chance_sigmas=0, chance_margin=0)) == pytest.approx(chance)


def test_a_retrieval_stop_is_one_line_naming_the_generation_epochs_and_what_was_seen():
    stop = judge_retrieval("g1", 4, 0.017, 0.016, 500, SPEC)
    assert stop is not None and stop.line.startswith("g1: own CMC@1 0.017 after 4 epochs, chance is 0.016 ")
    assert "\n" not in stop.line and "health.chance_sigmas" in stop.line
    assert judge_retrieval("g0", 1, 0.2, 0.0982, 500, SPEC) is None  # 0.2 passes the 0.138 floor
    assert judge_retrieval("g0", 1, 0.13, 0.0982, 500, SPEC).line.startswith("g0: own CMC@1 0.130 after 1 epoch,")
    assert judge_retrieval("g0", 1, float("nan"), 0.0982, 500, SPEC) is not None
    assert judge_retrieval("g0", 1, 0.0, float("nan"), 1, SPEC) is None  # nothing to tell apart


def test_a_loss_that_does_not_fall_stops_and_one_that_does_passes():
    assert judge_loss("g1", 5, 2.30, 1.20, SPEC) is None
    stop = judge_loss("g1", 5, 2.3086, 2.3026, SPEC)  # a 0.3 % drop: flat
    assert stop is not None and stop.line.startswith("g1: loss 2.3026 after 5 epochs, not below the first epoch's 2.3086")
    assert judge_loss("g1", 5, 2.0, 2.5, SPEC) is not None  # rising
    assert judge_loss("g1", 5, -0.10, -0.30, SPEC) is None  # negative totals fall too
    assert judge_loss("g1", 5, -0.30, -0.10, SPEC) is not None
    assert judge_loss("g1", 5, 2.0, 2.0, HealthSpec(min_loss_drop=0)) is not None
    assert judge_loss("g1", 5, 2.0, float("nan"), SPEC) is None


def test_a_map_that_does_not_fit_stops_a_generation_without_encoder_training():
    assert judge_fit("g2", 10, [0.9, 0.5, 0.3], SPEC) is None
    stop = judge_fit("g2", 10, [0.52, 0.52, 0.519], SPEC)
    assert stop is not None and stop.line.startswith("g2: its map's fit loss 0.5190 after 3 fit epochs")
    assert judge_fit("g2", 10, [0.5], SPEC) is None


def test_retrieval_is_judged_from_a_quarter_of_the_epochs_and_always_at_the_end():
    assert judged_from(SPEC, 20) == 5 and judged_from(SPEC, 200) == 50 and judged_from(SPEC, 4) == 3
    assert judged_from(SPEC, 2) == 3  # fewer epochs than min_epochs: only when it ends
    assert judged_from(SPEC, 20, warmup_epochs=8) == 9
    monitor = HealthMonitor(SPEC, "g", epochs=2)
    assert not monitor.due(1) and monitor.due(2)
    assert not HealthMonitor(HealthSpec(enabled=False), "g", epochs=2).due(2)


# --- real trainings on the digits (a few seconds each) ---------------------------------------

@pytest.fixture(scope="module")
def digits():
    torch.set_num_threads(1)
    return UpdateExperiment(ExperimentSettings(training=TrainConfig(epochs=2, batch_size=64, lr=0.05, augment=False)))


def _train(experiment: UpdateExperiment, training: TrainConfig, health: bool):
    settings = experiment.settings.model_copy(update={"training": training,
                                                      "health": HealthSpec(enabled=health)})
    experiment = UpdateExperiment(settings, experiment.train_images, experiment.eval_images)
    # lifelong.yaml's g0-old: HBCT's base loss on the classes 0-4
    return experiment.train(create_method("hbct", {"clip": 1.0, "mlr_max_scale": 3.0}), classes=list(range(5)), name="g0")


def test_a_healthy_short_training_passes_and_trains_exactly_as_without_the_check(digits):
    training = TrainConfig(epochs=2, batch_size=64, lr=0.05, augment=False)
    checked, unchecked = _train(digits, training, True), _train(digits, training, False)
    for (name, a), b in zip(checked.state_dict().items(), unchecked.state_dict().values()):
        assert torch.equal(a, b), name  # the check draws nothing from torch's RNG, changes no weight


def test_a_training_that_learns_nothing_stops_with_its_line(digits):
    """Adam at lr 1.0 on HBCT: the loss stays finite (ln 10 = 2.3026 from the second epoch on: flat
    logits) and the embeddings collapse to chance (a cosine model, ``independent``, survives it)."""
    training = TrainConfig(epochs=2, batch_size=64, optimizer="adam", lr=1.0, augment=False)
    with pytest.raises(TrainingUnhealthy) as stopped:
        _train(digits, training, True)
    line = str(stopped.value)
    assert line.startswith("g0: own CMC@1 ") and " after 2 epochs, chance is 0.197 " in line
    own = float(line.split("own CMC@1 ")[1].split()[0])
    assert own < 0.27  # the floor for 5 classes on 270 items: 0.197 + 3σ = 0.270


def test_the_sample_is_the_evaluation_split_of_the_training_classes():
    test = load_digits("test")
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    sample = health_sample(test, [0, 1, 2], 100, 32, mean, std)
    labels = np.array([int(sample[i][1]) for i in range(len(sample))])
    ids = {int(sample[i][2]) for i in range(len(sample))}
    assert len(sample) == 100 and set(labels) == {0, 1, 2} and ids <= set(test.ids.tolist())
    assert health_sample(test, [3], 100, 32, mean, std) is None  # one class: nothing to tell apart


def test_own_retrieval_leaves_the_rng_and_the_mode_as_they_were(digits):
    method = create_method("independent", {})
    from orchestrator.models.encoder import EncoderConfig

    torch.manual_seed(0)
    model = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=16), 10, torch.arange(10))
    model.train()
    sample = health_sample(digits.eval_images, None, 60, 32, digits.mean, digits.std)
    state = torch.random.get_rng_state()
    own, chance = own_cmc1(model, sample)
    assert torch.equal(state, torch.random.get_rng_state()) and model.training
    assert 0.0 <= own <= 1.0 and chance == pytest.approx(chance_cmc1([int(sample[i][1]) for i in range(60)]))


def test_run_update_experiment_stops_a_model_that_learns_nothing(digits):
    from orchestrator.evaluation.update_experiment import run_update_experiment

    settings = ExperimentSettings(training=TrainConfig(epochs=2, batch_size=64, optimizer="adam", lr=1.0, augment=False))
    experiment = UpdateExperiment(settings, digits.train_images, digits.eval_images)
    with pytest.raises(TrainingUnhealthy, match=r"^old/hbct#0: own CMC@1 0\.\d{3} after 2 epochs, chance is 0\.197 "):
        run_update_experiment(["hbct"], experiment=experiment)


def test_a_generation_without_encoder_training_is_judged_on_its_maps_fit_only():
    from orchestrator.models.encoder import EncoderConfig

    torch.manual_seed(0)
    model = create_method("fct", {}).build_model(EncoderConfig(arch="test_resnet", embed_dim=8), 10, torch.arange(10))
    monitor = HealthMonitor(SPEC, "g2", epochs=4, sample=None)
    assert monitor.after_training(model, {"fct_history": [{"loss": 0.5}, {"loss": 0.5}]}) is None  # trains its encoder
    model.encoder.requires_grad_(False)
    assert monitor.after_epoch(3, 2.3, model) is None  # no encoder trained: neither retrieval nor loss judged
    stop = monitor.after_training(model, {"fct_history": [{"loss": 0.5}, {"loss": 0.5}]})
    assert stop is not None and stop.line.startswith("g2: its map's fit loss 0.5000 after 2 fit epochs")
    assert monitor.after_training(model, {"lambda_orth_history": [{"loss": 0.9}, {"loss": 0.2}]}) is None
