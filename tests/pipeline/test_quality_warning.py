"""The training-time quality warning (issue 14 part 4): a generation whose own mAP falls far below
the unaligned reference's (P_up below ``evaluation.warn_p_up``) is named once per run, with the
numbers; none without a reference, a floor, or the measurements. P_up is recomputed here by hand."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator.config import PipelineConfigError, load_pipeline
from orchestrator.lineage.records import CompatibilityRecord
from orchestrator.metrics import update_summary
from orchestrator.pipeline.quality_warning import own_quality_warnings, reference_p_up, self_tests
from orchestrator.pipeline.runner import PipelineRunner

REPO = Path(__file__).resolve().parents[2]
PARENTS = {"g0-old": None, "g1": "g0-old", "g2": "g1", "phi-star": None}


def test_self_tests_keep_only_defined_diagonal_values_of_the_metric():
    values = [CompatibilityRecord("g1", "g1", "map", 0.5, "d"), CompatibilityRecord("g1", "g0", "map", 0.9, "d"),
              CompatibilityRecord("g0", "g0", "cmc@1", 0.7, "d"), CompatibilityRecord("g2", "g2", "map", None, "d")]
    assert self_tests(values) == {"g1": 0.5}


def test_a_generation_far_below_the_reference_is_named_with_its_p_up():
    selfs = {"g0-old": 0.30, "g1": 0.097, "g2": 0.43, "phi-star": 0.445}
    warnings = own_quality_warnings(selfs, PARENTS, "phi-star", -0.2)
    assert set(warnings) == {"g1"}  # g2: (0.43 - 0.445) / 0.445 = -0.034; g0-old has no parent
    expected = (0.097 - 0.445) / 0.445  # -0.782
    assert f"P_up {expected:+.3f} < evaluation.warn_p_up -0.2" in warnings["g1"]
    assert "g1's own mAP 0.0970 is far below the unaligned reference phi-star's 0.4450" in warnings["g1"]
    assert set(own_quality_warnings(selfs, PARENTS, "phi-star", -0.01)) == {"g1", "g2"}


@pytest.mark.parametrize("selfs, reference, floor", [
    ({"g1": 0.01, "phi-star": 0.5}, None, -0.2),      # no reference
    ({"g1": 0.01, "phi-star": 0.5}, "phi-star", None),  # warning off
    ({"g1": 0.01}, "phi-star", -0.2),                 # the reference not measured yet
    ({"g1": 0.01, "phi-star": 0.0}, "phi-star", -0.2),  # a zero reference: P_up undefined
    ({"g1": 0.001, "phi-star": 0.009}, "phi-star", -0.2),  # too weak to normalise by: the report prints n/a
    ({"phi-star": 0.5}, "phi-star", -0.2),            # the generation not measured yet
])
def test_nothing_is_said_without_the_measurements_or_the_setting(selfs, reference, floor):
    assert own_quality_warnings(selfs, PARENTS, reference, floor) == {}


def test_the_gate_and_the_warning_read_the_p_up_the_report_prints():
    # one rule (metrics.reported_p_up): a reference below MIN_NORMALISER gives no value anywhere
    weak, measured = {"g1": 0.001, "phi-star": 0.009}, {"g1": 0.2, "phi-star": 0.8}
    assert math.isnan(update_summary(0.001, 0.0, 0.0, 0.009)["p_up"]) and reference_p_up(weak, "g1", "phi-star") is None
    assert reference_p_up(measured, "g1", "phi-star") == update_summary(0.2, 0.1, 0.1, 0.8)["p_up"] == (0.2 - 0.8) / 0.8


def test_the_runner_says_it_once_per_run_from_the_recorded_values(tmp_path):
    config = load_pipeline(REPO / "pipelines" / "lifelong.yaml", {"storage": str(tmp_path / "run")})
    assert config.evaluation.reference == "phi-star" and config.evaluation.warn_p_up == -0.2
    lines: list[str] = []
    runner = PipelineRunner(config, progress=lines.append)
    dataset = config.data.eval_split
    runner.store.upsert_generation("g0-old"), runner.store.upsert_generation("g1", parent="g0-old")
    runner.store.upsert_generation("phi-star")
    runner.store.record_compatibility([("g1", "g1", "map", 0.2, dataset), ("g0-old", "g0-old", "map", 0.6, dataset)])
    runner._warn_own_quality()
    assert lines == []  # phi-star not measured yet
    runner.store.record_compatibility([("phi-star", "phi-star", "map", 0.8, dataset)])
    runner._warn_own_quality(), runner._warn_own_quality()
    assert len(lines) == 1 and "warning: g1's own mAP 0.2000" in lines[0] and "P_up -0.750" in lines[0], lines
    runner.store.close()


def test_the_floor_is_a_loss_between_none_and_everything():
    for value in (0.1, -1.5):
        with pytest.raises(PipelineConfigError, match="evaluation.warn_p_up"):
            load_pipeline(REPO / "pipelines" / "lifelong.yaml", {"evaluation.warn_p_up": value})
