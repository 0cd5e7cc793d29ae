"""The compatibility benchmark's table and the papers' orderings, on hand-built summaries."""
from __future__ import annotations

import math

import pytest

from orchestrator.benchmarks.compatibility import experiment_for, format_table, main, orderings


def _summary(p_com: float, compatible: bool = True, **values: float) -> dict:
    base = {"old_self": 0.5, "reference_self": 0.8, "self": 0.7, "cross": 0.6, "p_com": p_com, "p_up": -0.125}
    return {**base, **values, "compatible": compatible}


def _row(method: str, p_com: float, compatible: bool = True) -> dict:
    return {"method": method, "cmc@1": _summary(p_com, compatible), "map": _summary(p_com / 2, compatible)}


def test_orderings_state_each_claim_with_its_numbers():
    rows = [_row("hbct", 0.5), _row("hbct s10", 0.1), _row("bct", 0.3, compatible=False), _row("lce", 0.3)]
    assert orderings(rows) == [
        "P_com cmc@1: hbct ≥ bct (+0.50 vs +0.30): holds",
        "P_com map: hbct ≥ bct (+0.25 vs +0.15): holds",
        "P_com cmc@1: hbct s10 ≥ bct (+0.10 vs +0.30): does not hold",
        "P_com map: hbct s10 ≥ bct (+0.05 vs +0.15): does not hold",
        "P_com map: lce ≥ bct (+0.15 vs +0.15): holds",
        "bct passes the empirical criterion on CMC@1 and mAP: does not hold",
    ]


def test_an_undefined_p_com_is_not_comparable_and_missing_methods_are_left_out():
    rows = [_row("hbct", math.nan), _row("bct", 0.3)]
    assert orderings(rows)[0] == ("P_com cmc@1: hbct ≥ bct (– vs +0.30): not comparable "
                                  "(a P_com is undefined: its reference is not above the old model)")
    assert orderings([_row("lce", 0.2)]) == []


def test_table_cells_are_cmc_then_map():
    text = format_table([_row("bct", 0.3, compatible=False)])
    lines = text.splitlines()
    assert lines[0].startswith("| method | old self | ref self | self | cross | P_com | P_up |")
    assert lines[2] == ("| bct | 0.500 / 0.500 | 0.800 / 0.800 | 0.700 / 0.700 | 0.600 / 0.600 | "
                        "+0.30 / +0.15 | -0.12 / -0.12 | fails / fails |")


def test_bad_dataset_and_method_are_refused():
    with pytest.raises(ValueError, match="dataset: expected 'digits' or 'shapes', got 'mnist'"):
        experiment_for("mnist", 1)
    with pytest.raises(SystemExit):
        main(["--methods", "hbct,nope", "--datasets", "digits", "--epochs", "1"])


def test_the_seed_reaches_the_training_settings():
    experiment = experiment_for("digits", 3, seed=5)
    assert (experiment.settings.training.seed, experiment.settings.training.epochs) == (5, 3)
    assert experiment_for("digits", 3).settings.training.seed == 0
