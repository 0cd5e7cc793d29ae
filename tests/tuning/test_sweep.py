"""Sweeps end to end on a small pipeline, through the quick ASHA-versus-grid benchmark (both sweeps
over the same grid, the objective of pipelines/tune.yaml): parent and reference trained by the
pipeline's steps; the grid runs every configuration to its end, ASHA stops some after reporting
each epoch; every configuration ASHA finished scores exactly what the grid's run of it scored; the
table, the Pareto front and the constrained best recomputed from the table; the candidates in the
lineage; and the best configuration pasted into the pipeline reproducing the trial's numbers (and
its weights) through Ray Train. No benchmark target is asserted: those numbers mean something
only from a full run (benchmarks/README.md)."""
from __future__ import annotations

import csv
import itertools
import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from orchestrator.config import load_pipeline
from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import StepKind
from orchestrator.models.checkpoint import load_card
from orchestrator.pipeline.runner import PipelineRunner

pytestmark = pytest.mark.e2e

P_UP_MIN = -0.05  # the objective of pipelines/tune.yaml and of the benchmark


@pytest.fixture(scope="module")
def compared(bench, small):
    assert bench.OBJECTIVE == {"maximize": "cross_map", "subject_to": {"metric": "p_up_map", "min": P_UP_MIN}}
    return bench.compare(small.pipeline, small.folder, bench.QUICK, progress=lambda line: None)


def table(small, sweep: str) -> list[dict[str, str]]:
    with open(small.storage / "tune" / sweep / "trials.csv") as handle:
        return list(csv.DictReader(handle))


def number(text: str) -> float:
    return math.nan if text == "" else float(text)


def test_parent_and_reference_are_trained_by_the_pipeline_steps(compared, small):
    store = LineageStore(f"sqlite:///{small.storage}/lineage.db")
    steps = {s.key: (s.status, s.attempts) for s in store.steps()}
    # trained once, by the first sweep on this storage, never by a trial
    assert {k: v for k, v in steps.items() if k.startswith(StepKind.TRAIN.prefix)} == {
        "train:g0-old": ("committed", 1), "train:phi-star": ("committed", 1)}
    assert store.get_generation("g0-old").status == "trained" and not store.has_generation("g1")


def test_asha_against_the_grid_of_the_same_space(bench, compared):
    settings = bench.QUICK
    grid, asha = compared["grid"], compared["asha"]
    configurations = [dict(zip(settings["grid"], values)) for values in itertools.product(*settings["grid"].values())]
    key = lambda params: tuple(sorted(params.items()))  # noqa: E731
    for run in (grid, asha):
        assert sorted(key(t["params"]) for t in run["trials_table"]) == sorted(map(key, configurations))
    assert all(t["outcome"] == "finished" and t["epochs"] == 3 for t in grid["trials_table"])
    assert grid["trial_epochs"] == 3 * len(configurations) > asha["trial_epochs"] >= len(configurations)
    by_params = {key(t["params"]): t for t in grid["trials_table"]}
    for trial in asha["trials_table"]:
        if trial["outcome"] == "finished":  # deterministic trials: the very same numbers
            assert (trial["cross_map"], trial["p_up_map"]) == (by_params[key(trial["params"])]["cross_map"],
                                                               by_params[key(trial["params"])]["p_up_map"])
    feasible = [t["cross_map"] for t in grid["trials_table"] if t["p_up_map"] >= P_UP_MIN]
    assert grid["best_objective"] == max(feasible)
    assert asha["best_objective"] in feasible
    assert compared["best_ratio"] == asha["best_objective"] / grid["best_objective"]
    assert compared["trial_epochs_ratio"] == asha["trial_epochs"] / grid["trial_epochs"]
    assert "ASHA / grid" in bench.report(compared)


def test_every_trial_is_one_row_with_its_epochs(compared, small):
    rows = table(small, "bench-asha")
    folder = small.storage / "tune" / "bench-asha"
    for row in rows:
        epochs = int(row["epochs"])
        assert row["outcome"] == ("finished" if epochs == 3 else "stopped") and epochs >= 1  # grace period 1
        assert (row["checkpoint_uri"] != "") == (row["outcome"] == "finished")
    assert {row["outcome"] for row in rows} == {"finished", "stopped"}
    assert compared["asha"]["trial_epochs"] == sum(int(row["epochs"]) for row in rows)
    parquet = pq.read_table(folder / "trials.parquet").to_pylist()
    assert [r["trial_id"] for r in parquet] == [r["trial_id"] for r in rows]
    assert [r["cross_map"] for r in parquet] == pytest.approx([float(r["cross_map"]) for r in rows])
    assert (folder / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_epoch_is_reported_to_tune_with_the_evaluation(compared, small):
    for row in table(small, "bench-asha"):
        lines = (small.storage / "tune" / "bench-asha" / "experiment" / row["trial_id"] / "result.json").read_text()
        reports = [json.loads(line) for line in lines.splitlines()]
        assert [r["training_iteration"] for r in reports] == list(range(1, int(row["epochs"]) + 1))
        assert all(0 <= r["self_map"] <= 1 and 0 <= r["cross_map"] <= 1 for r in reports)
        assert reports[-1]["cross_map"] == pytest.approx(float(row["cross_map"]))


@pytest.mark.parametrize("sweep", ["bench-grid", "bench-asha"])
def test_objective_pareto_front_and_best_recomputed_from_the_table(compared, small, sweep):
    rows = table(small, sweep)
    for row in rows:
        cross, p_up = float(row["cross_map"]), float(row["p_up_map"])
        assert float(row["objective"]) == pytest.approx(cross - 10 * max(0.0, P_UP_MIN - p_up))
        assert number(row["feasible"]) == float(p_up >= P_UP_MIN)
        # P_up = (self − self_*)/self_*, with the same reference self_* for every trial
        assert p_up == pytest.approx(float(row["self_map"]) / float(rows[0]["self_map"]) * (1 + float(rows[0]["p_up_map"])) - 1)
    finished = [row for row in rows if row["outcome"] == "finished"]
    points = np.array([[float(r["self_map"]), float(r["cross_map"])] for r in finished])
    for row, p in zip(finished, points):
        dominated = any((q >= p).all() and (q > p).any() for q in points)
        assert row["pareto"] == str(not dominated)
    assert all(row["pareto"] == "False" for row in rows if row["outcome"] != "finished")
    feasible = [row for row in finished if float(row["p_up_map"]) >= P_UP_MIN]
    best = max(feasible, key=lambda r: float(r["cross_map"]))
    assert [row["trial_id"] for row in rows if row["best"] == "True"] == [best["trial_id"]]
    assert compared[sweep.removeprefix("bench-")]["best_objective"] == float(best["cross_map"])


def test_trials_are_candidates_in_the_lineage(compared, small):
    rows = table(small, "bench-asha")
    store = LineageStore(f"sqlite:///{small.storage}/lineage.db")
    candidates = {c.trial_id: c for c in store.candidates("bench-asha")}
    assert set(candidates) == {row["trial_id"] for row in rows}
    values = {(c.query, c.gallery, c.metric): c.value for c in store.compatibility_values("test")}
    for row in rows:
        record = candidates[row["trial_id"]]
        assert (record.outcome, record.epochs, record.parent) == (row["outcome"], int(row["epochs"]), "g0-old")
        generation = store.get_generation(record.name)
        assert (generation.params["lam"], generation.params["clip"]) == (float(row["param_lam"]), float(row["param_clip"]))
        assert values[(record.name, "g0-old", "map")] == pytest.approx(float(row["cross_map"]))
        assert values[(record.name, record.name, "cmc@1")] == pytest.approx(float(row["self_cmc@1"]))
        if row["outcome"] == "finished":
            assert generation.sha256 == load_card(row["checkpoint_uri"]).sha256
        with pytest.raises(ValueError, match="never deployed"):
            store.deploy(record.name)


def test_the_best_block_pasted_into_the_pipeline_reproduces_the_trial(compared, small, tmp_path):
    best = next(row for row in table(small, "bench-asha") if row["best"] == "True")
    block = yaml.safe_load((small.storage / "tune" / "bench-asha" / "best_generation.yaml").read_text())
    assert len(block) == 1 and block[0]["name"] == "g1"
    pipeline = yaml.safe_load(small.pipeline.read_text())
    pipeline["generations"] = [block[0] if g["name"] == "g1" else g for g in pipeline["generations"]]
    path = tmp_path / "pipeline_best.yaml"
    path.write_text(yaml.safe_dump(pipeline, sort_keys=False))
    config = load_pipeline(path)
    params = config.generation("g1").method.params
    assert (params["lam"], params["clip"]) == (float(best["param_lam"]), float(best["param_clip"]))

    result = PipelineRunner(config, progress=lambda line: None).run()  # g0-old, phi-star: committed, reused
    assert "train:g0-old" in result.skipped_steps and "train:g1" not in result.skipped_steps
    summary = result.summaries["g0-old → g1"]
    for metric in ("cmc@1", "map"):
        for kind in ("self", "cross", "p_up", "p_com"):
            # n/a on both sides: equal
            assert summary[metric][kind] == pytest.approx(float(best[f"{kind}_{metric}"]), abs=1e-6, nan_ok=True), (metric, kind)
    # same seed, same data order, one worker: the very same weights
    assert LineageStore(config.lineage).get_generation("g1").sha256 == load_card(best["checkpoint_uri"]).sha256
