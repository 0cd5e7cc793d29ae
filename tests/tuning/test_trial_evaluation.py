"""A trial's per-epoch evaluation embeds the frozen parent once and only the candidate per epoch,
on the pipeline's evaluation sample, with the numbers of the pipeline's evaluation."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from orchestrator.data import ImageTensorDataset, channel_statistics, load_digits, load_source
from orchestrator.evaluation import evaluate_generations, sample_split
from orchestrator.methods import create_method
from orchestrator.metrics import METRICS
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.tuning.trial import TrialEvaluator, TrialSetup

ENCODER = EncoderConfig(arch="test_resnet", embed_dim=8)
SAMPLE = 50


def tiny_hbct(seed: int) -> CompatibleModel:
    torch.manual_seed(seed)
    return create_method("hbct", {}).build_model(ENCODER, 10, range(10)).eval()


def test_the_parent_embeds_once_and_each_call_only_the_candidate(tmp_path, monkeypatch):
    parent, candidate = tiny_hbct(0), tiny_hbct(1)
    card = save_generation(parent, create_method("hbct", {}), None, str(tmp_path / "parent"), name="p")
    mean, std = channel_statistics(load_digits("train"))
    job = SimpleNamespace(mean=mean, std=std, parent_name="p", name="c", parent_uri=str(tmp_path / "parent"),
                          parent_sha256=card.sha256, storage_options=None)
    setup = TrialSetup(job={}, eval_source="digits", eval_options={"split": "test"}, image_size=32,
                       reference_self=None, objective={}, candidates_uri=str(tmp_path / "c"), eval_sample=SAMPLE)
    counts: dict[str, int] = {}
    original = CompatibleModel.forward

    def counting(self, images):
        who = "candidate" if self is candidate else "parent"
        counts[who] = counts.get(who, 0) + int(images.shape[0])
        return original(self, images)

    monkeypatch.setattr(CompatibleModel, "forward", counting)
    evaluate = TrialEvaluator(setup, job)
    first, second = evaluate(candidate), evaluate(candidate)
    assert counts == {"parent": SAMPLE, "candidate": 2 * SAMPLE}
    assert first == second

    images = sample_split(load_source("digits", split="test"), SAMPLE)
    report = evaluate_generations({"p": parent, "c": candidate}, ImageTensorDataset(images, 32, mean, std),
                                  parents={"c": "p"})
    for metric in METRICS:
        assert first[f"self_{metric}"] == pytest.approx(report.value("c", "c", metric), abs=1e-6)
        assert first[f"cross_{metric}"] == pytest.approx(report.value("c", "p", metric), abs=1e-6)
        assert first[f"old_self_{metric}"] == pytest.approx(report.value("p", "p", metric), abs=1e-6)
