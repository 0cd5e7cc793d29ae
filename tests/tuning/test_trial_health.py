"""A Tune trial runs the pipeline's health check (issue 38, item 1): a trial that learns nothing
reports its epoch with ``collapsed`` (the check's one line) and ends, writing nothing; the sweep's
table calls it collapsed, and the lineage records it as a stopped candidate with that line."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from orchestrator.data import channel_statistics, load_digits
from orchestrator.methods import create_method
from orchestrator.models.checkpoint import checkpoint_exists, save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.config import HealthSpec
from orchestrator.training.generation import GenerationJob
from orchestrator.tuning import sweep
from orchestrator.tuning.results import TrialRow


def test_a_trial_that_learns_nothing_is_reported_collapsed_and_ends(tmp_path, trial_here):
    torch.set_num_threads(1)
    encoder = EncoderConfig(arch="test_resnet", embed_dim=16)
    torch.manual_seed(0)
    parent = create_method("hbct", {}).build_model(encoder, 10, range(10)).eval()
    card = save_generation(parent, create_method("hbct", {}), encoder, str(tmp_path / "parent"), name="p")
    train = load_digits("train")
    mean, std = channel_statistics(train)
    job = GenerationJob(name="c", method="hbct", method_params={"clip": 1.2}, encoder=encoder.model_dump(mode="json"),
                        training={"epochs": 2, "batch_size": 64, "optimizer": "adam", "lr": 1.0, "augment": False},
                        num_classes=10, data_source="digits", output_uri=str(tmp_path / "c"),
                        data_options={"split": "train"}, mean=tuple(mean), std=tuple(std),
                        train_ids=train.ids.tolist(), parent_name="p",
                        parent_uri=str(tmp_path / "parent"), parent_sha256=card.sha256, seed=3,
                        health=HealthSpec().model_dump(mode="json"), health_source="digits",
                        health_options={"split": "test"})
    reports = trial_here(job, str(tmp_path / "candidates"), {})
    assert len(reports) == 2 and "collapsed" not in reports[0]  # judged when it ends: 2 epochs < min_epochs
    assert reports[-1]["collapsed"].startswith("c: own CMC@1 ") and " after 2 epochs, chance is 0.098 " in reports[-1]["collapsed"]
    assert not checkpoint_exists(str(tmp_path / "candidates" / "t1"))


def test_the_sweep_table_calls_a_collapsed_trial_collapsed():
    line = "c: own CMC@1 0.101 after 2 epochs, chance is 0.098 (...)"
    grid = [SimpleNamespace(metrics={"training_iteration": 2, "collapsed": line, "objective": 0.1}, path="/s/t1",
                            error=None, config={"lam": 0.5}),
            SimpleNamespace(metrics={"training_iteration": 2, "objective": 0.3}, path="/s/t2", error=None,
                            config={"lam": 0.7})]
    rows = sweep._rows(grid, ["lam"], 2, "/nowhere/candidates")
    assert [r.outcome for r in rows] == ["collapsed", "finished"]
    assert rows[0].collapsed == line and rows[0].record(["lam"])["collapsed"] == line
    assert TrialRow("t", "finished", 2, 1.0, {}).record([])["collapsed"] is None
