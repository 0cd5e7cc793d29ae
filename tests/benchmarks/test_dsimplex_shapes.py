"""benchmarks/dsimplex_shapes.py: the overrides run the shipped d-Simplex file on the shapes with
the stand-ins, and the stand-ins' classes are ones that file never trains on."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.dsimplex_shapes import (
    PIPELINE,
    SHAPES_24,
    STAND_IN_CLASSES,
    STAND_INS,
    format_gates,
    pipeline_overrides,
)
from orchestrator.cli_options import add_pipeline_options
from orchestrator.cli_options import pipeline_overrides as parsed_overrides
from orchestrator.config import load_pipeline
from orchestrator.data.procedural import PATTERNS, SHAPES
from orchestrator.data.selection import training_indices


def _config(tmp_path: Path, gate_action: str = "hold"):
    checkpoints = {index: tmp_path / f"ckpt{index}.safetensors" for index, _ in STAND_INS}
    parser = argparse.ArgumentParser()
    add_pipeline_options(parser, ["set"])
    args = parser.parse_args(pipeline_overrides(checkpoints, 3, gate_action))
    return load_pipeline(PIPELINE, parsed_overrides(args)), checkpoints


def test_overrides_change_data_stand_ins_epochs_and_device_only(tmp_path):
    shipped = load_pipeline(PIPELINE)
    config, checkpoints = _config(tmp_path, "force")
    assert config.data.source == "shapes" and config.data.options == SHAPES_24
    assert config.gallery.source is None and config.gallery.options is None  # the shapes' own test split
    assert not config.ray.use_gpu and config.ray.gpus_per_worker == 0
    assert [g.model.pretrained for g in config.generations] == [
        str(checkpoints[0]), None, str(checkpoints[2]), None, str(checkpoints[4]), None, None]
    for ours, theirs in zip(config.generations, shipped.generations, strict=True):
        assert ours.training.epochs == 3 and ours.gate.action == "force"
        assert (ours.method, ours.replaces, ours.init_from_parent, ours.classes, ours.backfill) == \
               (theirs.method, theirs.replaces, theirs.init_from_parent, theirs.classes, theirs.backfill)
        assert ours.model.model_dump(exclude={"pretrained"}) == theirs.model.model_dump(exclude={"pretrained"})
    # 7 tasks cover the 24 classes: 6, then 3 more each
    labels = np.repeat(np.arange(24), 2)
    seen = [np.unique(labels[training_indices(g, labels, config.data.task_splits)]) for g in config.generations]
    assert [len(s) for s in seen] == [6, 9, 12, 15, 18, 21, 24]  # new classes plus the memory of the earlier ones


def test_stand_in_classes_are_pairs_the_pipeline_never_trains_on():
    """The stand-ins' 60-class shapes label (shape s, pattern p) as 6s + p; the pipeline's 24-class
    shapes use shapes 0-5 and patterns 0-3. No stand-in class is one of those pairs."""
    pairs = {(SHAPES[c // len(PATTERNS)], PATTERNS[c % len(PATTERNS)]) for c in STAND_IN_CLASSES}
    pipeline_pairs = {(s, p) for s in SHAPES[:6] for p in PATTERNS[:4]}
    assert len(pairs) == len(STAND_IN_CLASSES) == 36 and not pairs & pipeline_pairs
    assert [n for _, n in STAND_INS] == [12, 24, 36]


def test_format_gates_reads_deployed_forced_and_held_steps():
    def gate(generation, serving, ok, predicted, serving_quality):
        return {"status": "committed", "outputs": {"generation": generation, "serving": serving,
                                                   "verdicts": [["task1", ok, "why"]], "predicted": predicted,
                                                   "serving_quality": serving_quality}}

    lineage = {"steps": [
        {"key": "gate:g:task2", **gate("task2", "task1", True, 0.52, 0.50)},
        {"key": "deploy:task2", "status": "committed", "outputs": {"gate": {"failures": [], "action": "deploy"}}},
        {"key": "gate:g:task3", **gate("task3", "task2", False, 0.40, 0.52)},
        {"key": "deploy:task3", "status": "committed",
         "outputs": {"gate": {"failures": ["criterion"], "action": "force"}}},
        {"key": "gate:g:task4", **gate("task4", "task3", False, 0.30, 0.40)},
        {"key": "gate:g:task5", "status": "committed",
         "outputs": {**gate("task5", "task3", True, 0.399, 0.40)["outputs"], "predicted_se": 0.0012}},
        {"key": "deploy:task4", "status": "failed", "outputs": {}},
    ]}
    rows = format_gates(lineage).splitlines()[2:]
    assert rows == ["| task2 | task1 | → task1: passes | 0.5200 / 0.5000 | deployed |",
                    "| task3 | task2 | → task1: fails | 0.4000 / 0.5200 | force (criterion) |",
                    "| task4 | task3 | → task1: fails | 0.3000 / 0.4000 | held (failed) |",
                    "| task5 | task3 | → task1: passes | 0.3990 / 0.4000 (SE 0.0012) | not run |"]
