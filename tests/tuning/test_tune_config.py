"""Tune files: the reference file loads against its pipeline, and every kind of mistake is one line
naming the file, the field path, the bad value and its line (as pipeline files do)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.config import PipelineConfigError
from orchestrator.tuning.config import METRIC_NAMES, TuneFileError, load_tune_file

REPO = Path(__file__).resolve().parents[2]
LIFELONG = str(REPO / "pipelines" / "lifelong.yaml")


def write_tune(tmp_path: Path, text: str) -> str:
    path = tmp_path / "tune.yaml"
    path.write_text(text)
    return str(path)


BASE = """\
name: t
pipeline: {pipeline}
transition: {{parent: g0-old, candidate: g1}}
space:
  lam: {{loguniform: [0.03, 3.0]}}
  entail: {{grid: [true, false]}}
objective:
  maximize: cross_map
  subject_to: {{metric: p_up_map, min: -0.01}}
"""


def test_the_reference_tune_file_loads_against_lifelong(monkeypatch):
    monkeypatch.chdir(REPO)  # its pipeline path is relative to the project root
    tune_file = load_tune_file("pipelines/tune.yaml")
    spec = tune_file.spec
    assert tune_file.candidate.name == "g1" and tune_file.parent.name == "g0-old"
    assert set(spec.space) == {"lam", "clip", "entail_weight"}
    assert spec.space["clip"].choice == [1.1, 1.2, 1.4] and spec.space["lam"].loguniform == (0.03, 3.0)
    assert spec.objective.kind == "constrained" and spec.objective.metrics == ["cross_map", "p_up_map"]
    assert tune_file.pipeline.storage == "./runs/lifelong" and spec.name == "hbct-g1"


def test_values_are_normalised_by_the_method_parameters(tmp_path):
    text = BASE.format(pipeline=LIFELONG).replace("lam: {loguniform: [0.03, 3.0]}", "lam: {grid: [1, 3]}")
    spec = load_tune_file(write_tune(tmp_path, text)).spec
    assert spec.space["lam"].grid == [1.0, 3.0] and all(isinstance(v, float) for v in spec.space["lam"].grid)
    assert spec.space["entail"].grid == [True, False]


@pytest.mark.parametrize("old, new, expected", [
    # a parameter the method does not have, with the close name suggested
    ("  lam: {loguniform: [0.03, 3.0]}", "  lamda: {loguniform: [0.03, 3.0]}",
     "space.lamda: not a parameter of method 'hbct' (did you mean 'lam'?); parameters: curv, clip, lam, "
     "entail_weight, entail, min_radius, beta, tau, contrastive, q_min, distance, mlr_init_scale, mlr_learn_scale, "
     "mlr_max_scale, lam_warmup (got \"lamda\") [line 5]"),
    # a value the method's Params rejects (beta in (0, 1])
    ("  entail: {grid: [true, false]}", "  beta: {choice: [0.01, 2]}",
     "space.beta.choice[1]: Input should be less than or equal to 1 (got 2) [line 6]"),
    # floats drawn for a bool parameter
    ("  entail: {grid: [true, false]}", "  entail: {uniform: [0, 1]}",
     "space.entail.uniform: draws floats, but hbct.entail is bool: use grid or choice (got [0.0, 1.0]) [line 6]"),
    ("  lam: {loguniform: [0.03, 3.0]}", "  lam: {loguniform: [0, 3.0]}",
     "space.lam.loguniform: needs 0 < low (a log scale) (got [0.0, 3.0]) [line 5]"),
    ("  lam: {loguniform: [0.03, 3.0]}", "  lam: {uniform: [3.0, 1.0]}",
     "space.lam.uniform: needs low < high (got [3.0, 1.0]) [line 5]"),
    ("  lam: {loguniform: [0.03, 3.0]}", "  lam: {grid: [1], choice: [2]}",
     "space.lam: give exactly one of grid: [...], choice: [...], uniform: [low, high], loguniform: [low, high] "
     "(got grid, choice) [line 5]"),
    ("transition: {parent: g0-old, candidate: g1}", "transition: {parent: g0-old, candidate: g7}",
     "transition.candidate: no generation of this name in {pipeline}; generations: g0-old, g1, g2, phi-star "
     "(got \"g7\") [line 3]"),
    ("transition: {parent: g0-old, candidate: g1}", "transition: {parent: g1, candidate: g2}",
     None),  # a valid transition further down the chain
    ("transition: {parent: g0-old, candidate: g1}", "transition: {parent: g0-old, candidate: g2}",
     "transition.parent: 'g2' has the parent 'g1' in {pipeline} (got \"g0-old\") [line 3]"),
    ("transition: {parent: g0-old, candidate: g1}", "transition: {candidate: g0-old}",
     "transition.candidate: a sweep tunes an update: the candidate needs a parent generation (got \"g0-old\") [line 3]"),
    ("  subject_to: {metric: p_up_map, min: -0.01}", "  subject_to: {metric: p_up_mAP, min: -0.01}",
     "objective.subject_to.metric: Input should be " + " or ".join([", ".join(f"'{m}'" for m in METRIC_NAMES[:-1]),
                                                                   f"'{METRIC_NAMES[-1]}'"]) + " (got \"p_up_mAP\") [line 9]"),
    ("  subject_to: {metric: p_up_map, min: -0.01}", "  subject_to: {metric: p_up_map, min: -0.01, max: 1}",
     "objective.subject_to: give exactly one bound: min or max [line 9]"),
    ("  maximize: cross_map", "  maximize: cross_map\n  pareto: [self_map, cross_map]",
     "objective: give exactly one of maximize: <metric> or pareto: [<metric>, <metric>] [line 7]"),
    ("name: t", "name: t\nepochs: 3", "epochs: unknown field; allowed: name, description, pipeline, transition, "
     "space, search, scheduler, resources, max_concurrent_trials, max_failures, objective (got 3) [line 2]"),
    ("name: t", "name: t\nscheduler: {kind: asha, grace_period: 21}",
     "scheduler.grace_period: longer than the candidate's training (20 epochs) (got 21) [line 2]"),
    ("name: t", "name: t\nsearch: {algorithm: optuna}",
     "space.entail.grid: Optuna samples every parameter: use choice: [...] (or algorithm: random for a full grid) "
     "(got [true, false]) [line 7]"),
    ("name: t", "name: t/x", "name: not a valid name: 1-64 characters of A-Z a-z 0-9 _ - and dots, not starting with a dot (it names a "
     "folder: no separators, no . or ..) (got \"t/x\") [line 1]"),
])
def test_a_bad_field_is_one_line_naming_file_field_value_and_line(tmp_path, old, new, expected):
    text = BASE.format(pipeline=LIFELONG)
    assert old in text
    path = write_tune(tmp_path, text.replace(old, new))
    if expected is None:
        assert load_tune_file(path).candidate.name == "g2"
        return
    with pytest.raises(TuneFileError) as error:
        load_tune_file(path)
    assert str(error.value) == f"{path}: {expected.format(pipeline=LIFELONG)}"


def test_p_com_and_p_up_need_an_evaluation_reference(tmp_path):
    pipeline = yaml.safe_load(Path(LIFELONG).read_text())
    pipeline["evaluation"] = {"reference": None}
    pipeline["generations"] = [g for g in pipeline["generations"] if g["name"] != "phi-star"]
    pipeline_path = tmp_path / "no_reference.yaml"
    pipeline_path.write_text(yaml.safe_dump(pipeline))
    path = write_tune(tmp_path, BASE.format(pipeline=pipeline_path))
    with pytest.raises(TuneFileError) as error:
        load_tune_file(path)
    assert str(error.value) == (f"{path}: objective: p_up_map is normalised by the evaluation reference φ_*, but "
                                f"{pipeline_path} names none (evaluation.reference) (got \"p_up_map\") [line 7]")
    # without P_com / P_up the same pipeline is fine
    path = write_tune(tmp_path, BASE.format(pipeline=pipeline_path).replace(
        "  subject_to: {metric: p_up_map, min: -0.01}\n", ""))
    assert load_tune_file(path).spec.objective.kind == "maximize"


def test_a_missing_pipeline_is_an_error_of_the_tune_file_and_a_bad_one_names_the_pipeline(tmp_path):
    path = write_tune(tmp_path, BASE.format(pipeline=tmp_path / "nope.yaml"))
    with pytest.raises(TuneFileError, match=r"tune.yaml: pipeline: no such pipeline file \(looked for .*nope.yaml\) \[line 2\]"):
        load_tune_file(path)
    bad = tmp_path / "bad_pipeline.yaml"
    bad.write_text(Path(LIFELONG).read_text().replace("  num_workers: 1", "  num_workers: -1"))
    with pytest.raises(PipelineConfigError) as error:
        load_tune_file(write_tune(tmp_path, BASE.format(pipeline=bad)))
    assert not isinstance(error.value, TuneFileError)
    assert str(error.value).startswith(f"{bad}: ray.num_workers: Input should be greater than or equal to 0 (got -1)")


def test_the_cli_rejects_a_bad_tune_file_before_starting_anything(tmp_path, capsys):
    from orchestrator.cli import main

    path = write_tune(tmp_path, BASE.format(pipeline=LIFELONG).replace("  lam: {loguniform", "  lamda: {loguniform"))
    assert main(["tune", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"orchestrator: error: {path}: space.lamda: not a parameter of method 'hbct' (did you mean 'lam'?)")
    assert not (REPO / "runs" / "lifelong" / "tune" / "t").exists()


def test_a_posthoc_generation_is_a_candidate_whose_trials_report_once(tmp_path):
    """A post-hoc map trains no epoch: its parameters (here the paired sample's size) are searched by
    trials that fit the map once and report once (tests/tuning/test_slerp_tuning.py runs one)."""
    from orchestrator.tuning.config import trial_reports

    pipeline = str(REPO / "pipelines" / "posthoc.yaml")
    text = (f"name: t\npipeline: {pipeline}\ntransition: {{parent: g0-old, candidate: g1-posthoc}}\n"
            "space:\n  pairs: {grid: [100, 500]}\nobjective:\n  maximize: cross_map\n")
    tune_file = load_tune_file(write_tune(tmp_path, text))
    assert tune_file.candidate.method.name == "low_rank_affine" and trial_reports(tune_file.candidate) == 1
    assert tune_file.reports == 1
