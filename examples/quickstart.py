"""Quickstart: an old model and a backward-compatible new model on the bundled digits.

Run: python examples/quickstart.py [--epochs N]
Prints the compatibility table (every query-generation → gallery-generation pair) and the
summary of the update: self / cross retrieval, the empirical criterion, P_com and P_up.
"""
import argparse

import torch

from orchestrator.evaluation.update_experiment import ExperimentSettings, UpdateExperiment
from orchestrator.methods import create_method
from orchestrator.training.config import TrainConfig


def main(epochs: int) -> None:
    torch.set_num_threads(1)
    settings = ExperimentSettings(training=TrainConfig(epochs=epochs, batch_size=64, lr=0.05, augment=False))
    experiment = UpdateExperiment(settings)                       # bundled digits, timm test_resnet
    old = experiment.train(create_method("independent"), classes=experiment.old_classes())
    reference = experiment.train(create_method("independent"))  # φ*: new data, no alignment
    new = experiment.train(create_method("bct", {"lam": 1.0}), parent=old)
    report = experiment.evaluate({"old": old, "reference": reference, "new": new}, parents={"new": "old"})
    print(report.format_table())
    for metric in ("cmc@1", "map"):
        summary = report.compatibility("old", "new", reference="reference", metric=metric)
        print(metric, {key: round(value, 4) if isinstance(value, float) else value for key, value in summary.items()})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=20)
    main(parser.parse_args().epochs)
