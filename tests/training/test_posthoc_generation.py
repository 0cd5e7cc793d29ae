"""A generation that trains no encoder (training/generation.py with a post-hoc method): it takes a
given generation's encoder unchanged and frozen, runs no epoch, fits its map on the paired sample
(from the training items or the gallery's split) and is judged on that fit by the health check."""
from __future__ import annotations

import pytest
import torch

from orchestrator.data import channel_statistics, load_digits
from orchestrator.methods import create_method
from orchestrator.methods.loading import load_generation
from orchestrator.methods.posthoc import HISTORY
from orchestrator.models.adapters import BACKWARD_ADAPTER, ChartMap
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.config import HealthSpec
from orchestrator.training.generation import GenerationJob, GenerationTraining
from orchestrator.training.health import trains_encoder


def _saved(tmp_path, name: str, method: str, params: dict, arch: str, seed: int) -> tuple[str, str]:
    encoder = EncoderConfig(arch=arch, embed_dim=16)
    torch.manual_seed(seed)
    model = create_method(method, params).build_model(encoder, 10, range(10)).eval()
    card = save_generation(model, create_method(method, params), encoder, str(tmp_path / name), name=name)
    return str(tmp_path / name), card.sha256


def _job(tmp_path, method_params: dict, **extra) -> GenerationJob:
    # the parent's encoder is the given one's (same weights), in another space: the map must find it
    parent_uri, parent_sha = _saved(tmp_path, "old", "independent", {"space": "euclidean"}, "test_convnext", 1)
    given_uri, given_sha = _saved(tmp_path, "given", "independent", {}, "test_convnext", 1)
    train = load_digits("train")
    mean, std = channel_statistics(train)
    return GenerationJob(name="new", method="procrustes", method_params=method_params,
                         encoder=EncoderConfig(arch="test_convnext", embed_dim=16).model_dump(mode="json"),
                         training={"batch_size": 64}, num_classes=10, data_source="digits",
                         output_uri=str(tmp_path / "new"), data_options={"split": "train"}, mean=tuple(mean),
                         std=tuple(std), train_ids=train.ids.tolist(), parent_name="old", parent_uri=parent_uri,
                         parent_sha256=parent_sha, encoder_uri=given_uri, encoder_sha256=given_sha, seed=5,
                         health=HealthSpec().model_dump(mode="json"), **extra)


@pytest.mark.parametrize("pairs_from", ["train", "gallery"])
def test_a_posthoc_generation_keeps_the_given_encoder_and_fits_its_map(tmp_path, pairs_from):
    extra = {"pairs_source": "digits", "pairs_options": {"split": "test"}} if pairs_from == "gallery" else {}
    job = _job(tmp_path, {"pairs": 120, "pairs_from": pairs_from}, **extra)
    session = GenerationTraining(job)
    given, _card = load_generation(job.encoder_uri)
    assert session.epochs == 0 and session.optimizer is None and not trains_encoder(session.model)
    assert all(torch.equal(given.encoder.state_dict()[k], v) for k, v in session.model.encoder.state_dict().items())
    health = session.watch_health()
    session.start()
    expected_items = 539 if pairs_from == "gallery" else len(load_digits("train"))
    assert len(session.ctx.pair_data if pairs_from == "gallery" else session.ctx.train_data) == expected_items
    session.finish()
    history = [h["loss"] for h in session.ctx.state[HISTORY]]
    assert len(history) == 2 and history[1] < history[0]  # the mean map's error, then Procrustes'
    # the same encoder on both sides: a Euclidean embedding is its norm times the cosine one, so
    # the best scaled rotation from the sphere is the identity times their mean norm
    weight = session.model.adapters[BACKWARD_ADAPTER].map.linear.weight.detach()
    torch.testing.assert_close(weight / weight[0, 0], torch.eye(16), atol=1e-4, rtol=0)
    assert session.check_health_at_end() is None  # judged on its map's fit, which fell
    metrics = session.fit_metrics()
    assert metrics["loss"] == history[1] and metrics["loss/mean_map"] == history[0] and metrics["fit_seconds"] > 0
    card = session.save()
    loaded, _ = load_generation(job.output_uri, expected_sha256=card.sha256)
    assert isinstance(loaded.adapters[BACKWARD_ADAPTER], ChartMap)
    assert all(torch.equal(given.encoder.state_dict()[k], v) for k, v in loaded.encoder.state_dict().items())
    assert health is not None


def test_a_map_that_explains_nothing_is_stopped_by_the_health_check(tmp_path):
    session = GenerationTraining(_job(tmp_path, {"pairs": 120}))
    session.watch_health()
    session.start()
    session.finish()
    mean_map = session.ctx.state[HISTORY][0]["loss"]
    session.ctx.state[HISTORY][-1]["loss"] = mean_map  # as if the fit had found nothing
    stop = session.check_health_at_end()
    assert stop is not None and "its map's fit loss" in stop.line and "health.min_fit_drop" in stop.line
