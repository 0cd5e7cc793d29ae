"""The compatibility benchmark's table and the papers' orderings, on hand-built summaries."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import compatibility
from benchmarks.compatibility import METHODS, experiment_for, format_summary, format_table, main, orderings, targets
from orchestrator.config import load_pipeline
from orchestrator.data import load_shapes
from orchestrator.methods import create_method, references
from orchestrator.metrics import update_summary

REPO = Path(__file__).resolve().parents[2]


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
    assert lines[0].startswith("| method | old self | ref self | self | cross | P_com | P_up | backfill saved |")
    saved = (0.6 - 0.5) / (0.7 - 0.5)  # (cross − old self) / (self − old self), from the row's own values
    assert lines[2] == ("| bct | 0.500 / 0.500 | 0.800 / 0.800 | 0.700 / 0.700 | 0.600 / 0.600 | "
                        f"+0.30 / +0.15 | -0.12 / -0.12 | {saved:+.2f} / {saved:+.2f} | fails / fails |")


def test_bad_dataset_and_method_are_refused():
    with pytest.raises(ValueError, match="dataset: expected 'digits', 'shapes' or 'shapes-60', got 'mnist'"):
        experiment_for("mnist", 1)
    with pytest.raises(SystemExit):
        main(["--methods", "hbct,nope", "--datasets", "digits", "--epochs", "1"])


def test_shapes_60_is_the_held_out_checks_regime(monkeypatch, request):
    """60 classes of 600 training images at 32x32, batch 128, embed_dim 64 (the data is not rendered
    here: load_shapes is replaced by a recorder of its arguments)."""
    calls = []

    def tiny(split, image_size, **options):
        calls.append((split, image_size, options))
        return load_shapes(split, image_size=8, num_shapes=2, num_patterns=2, train_per_class=2, test_per_class=2)

    monkeypatch.setattr(compatibility, "load_shapes", tiny)
    compatibility._shapes.cache_clear()  # rendered once per process: render these tiny ones, forget them after
    request.addfinalizer(compatibility._shapes.cache_clear)
    experiment = experiment_for("shapes-60", 4, seed=1)
    options = {"num_shapes": 10, "num_patterns": 6, "train_per_class": 600, "test_per_class": 20}
    assert calls == [("train", 32, options), ("test", 32, options)]
    settings = experiment.settings
    assert (settings.embed_dim, settings.image_size) == (64, 32)
    assert (settings.training.batch_size, settings.training.epochs, settings.training.seed) == (128, 4, 1)
    experiment_for("shapes-60", 8, seed=2)
    assert len(calls) == 2  # every budget and seed measures the same rendered images
    experiment_for("shapes-60", 4, seed=1, test_per_class=100)
    assert calls[-2:] == [("train", 32, {**options, "test_per_class": 100}), ("test", 32, {**options, "test_per_class": 100})]


def test_the_seed_reaches_the_training_settings():
    experiment = experiment_for("digits", 3, seed=5)
    assert (experiment.settings.training.seed, experiment.settings.training.epochs) == (5, 3)
    assert experiment_for("digits", 3).settings.training.seed == 0


def _measured(method: str, old_map: float, p_com_map: float, p_up: tuple[float, float] = (0.0, 0.0),
              compatible: tuple[bool, bool] = (True, True)) -> dict:
    """A row as ``measure`` returns it: CMC@1 and mAP summaries with the old model's self-test."""
    return {"method": method,
            "cmc@1": _summary(0.9, compatible[0], old_self=0.2, p_up=p_up[0]),
            "map": _summary(p_com_map, compatible[1], old_self=old_map, p_up=p_up[1])}


def test_targets_follow_issue_14_against_the_tables_bct_row():
    rows = [_measured("bct", old_map=0.150, p_com_map=0.50),
            _measured("hbct", old_map=0.099, p_com_map=0.46),                  # old 0.051 below bct's: misses
            _measured("hbct old-t", old_map=0.101, p_com_map=math.nan),        # undefined P_com: misses
            _measured("hbct s2", old_map=0.20, p_com_map=0.44, p_up=(-0.04, -0.06)),  # P_com 0.06 below; P_up mAP
            _measured("hbct s3", old_map=0.20, p_com_map=0.9, compatible=(False, True))]
    verdicts = targets(rows)
    assert set(verdicts) == {"hbct", "hbct old-t", "hbct s2", "hbct s3"}
    assert verdicts["hbct"] == {"criterion": True, "p_up": True, "old": False, "p_com": True}
    assert verdicts["hbct old-t"] == {"criterion": True, "p_up": True, "old": True, "p_com": False}
    assert verdicts["hbct s2"] == {"criterion": True, "p_up": False, "old": True, "p_com": False}
    assert verdicts["hbct s3"] == {"criterion": False, "p_up": True, "old": True, "p_com": True}
    without_bct = targets(rows[1:2])
    assert without_bct["hbct"]["old"] is False and without_bct["hbct"]["p_com"] is False


def _update(method: str, old: float, reference: float, new: float, cross: float) -> dict:
    """A row as ``measure`` returns it, its mAP summary computed from the four tests (CMC@1: an
    update that meets every target)."""
    def summary(old_self, reference_self, self_, cross_):
        return {**update_summary(self_, cross_, old_self, reference_self), "reference_self": reference_self}
    return {"method": method, "cmc@1": summary(0.2, 0.6, 0.6, 0.4), "map": summary(old, reference, new, cross)}


#: Two seeds. Seed 0: HBCT meets every target (P_com 0.5 against BCT's 0.4). Seed 1: HBCT's φ_*
#: beats its old model by 0.005 < MIN_NORMALISER (P_com undefined) and its old model is 0.20 below
#: BCT's (0.10 against 0.30).
_TWO_SEEDS = [[_update("hbct", 0.20, 0.60, 0.60, 0.40), _update("bct", 0.20, 0.60, 0.60, 0.36)],
              [_update("hbct", 0.10, 0.105, 0.60, 0.40), _update("bct", 0.30, 0.60, 0.60, 0.45)]]


def test_the_mean_update_is_computed_from_the_seed_means_of_the_tests():
    hbct, bct = compatibility.seed_means(_TWO_SEEDS)
    # hbct mAP: old (0.2 + 0.1)/2 = 0.15, φ_* (0.6 + 0.105)/2 = 0.3525, new 0.6, cross 0.4
    assert hbct["map"]["old_self"] == pytest.approx(0.15) and hbct["map"]["reference_self"] == pytest.approx(0.3525)
    assert hbct["map"]["p_com"] == pytest.approx((0.4 - 0.15) / (0.3525 - 0.15))  # defined for the mean
    assert hbct["map"]["p_up"] == pytest.approx((0.6 - 0.3525) / 0.3525)
    assert hbct["map"]["compatible"] and hbct["cmc@1"]["p_com"] == pytest.approx(0.5)
    # bct: old 0.25, cross 0.405, φ_* 0.6
    assert bct["map"]["p_com"] == pytest.approx((0.405 - 0.25) / (0.6 - 0.25))


def test_the_summary_counts_seeds_and_averages_by_hand():
    lines = format_summary(_TWO_SEEDS).splitlines()
    assert lines[0].startswith("| variant | seeds | all targets | criterion |")
    # per seed: seed 0 meets all, seed 1 misses old and P_com (undefined). The mean update meets
    # P_com (1.23 ≥ 0.44 − 0.05) but not old (0.15 < 0.25 − 0.05). Means: old, self, cross mAP.
    assert lines[2] == "| hbct | 2 | 1 | 2 | 2 | 1 | 1 (1) | old | 0.150 | 0.600 | 0.400 |"
    assert lines[3] == "| bct | 2 | – | – | – | – | – | – | 0.250 | 0.600 | 0.405 |"


@pytest.mark.parametrize("pipeline", ["lifelong", "shapes"])
def test_the_pipelines_hbct_recipe_is_the_benchmarks_row(pipeline):
    """What benchmarks/README.md measures as ``hbct`` (round 4's ``hbct t≤1.5 old-t≤3``) is what the
    pipelines train: the old generation = the update's parent method, g1 = the row's method,
    phi-star = its unaligned reference (all HBCT parameters compared, defaults included)."""
    _, name, params = next(row for row in METHODS if row[0] == "hbct")
    update = create_method(name, params)
    config = load_pipeline(REPO / "pipelines" / f"{pipeline}.yaml", {"storage": "unused"})
    trained = {g: create_method(config.generation(g).method.name, config.generation(g).method.params).params.model_dump()
               for g in ("g0-old", "g1", "g2", "phi-star")}
    assert trained["g0-old"] == references.parent_method(update).params.model_dump()
    assert (trained["g0-old"]["mlr_learn_scale"], trained["g0-old"]["mlr_max_scale"]) == (True, 3.0)
    assert trained["g1"] == update.params.model_dump()
    assert (trained["g1"]["mlr_learn_scale"], trained["g1"]["mlr_max_scale"]) == (True, 1.5)
    assert trained["g2"] == {**update.params.model_dump(), "clip": 1.4}  # ζ grows by 0.2 per generation
    assert trained["phi-star"] == references.reference_method(update).params.model_dump()


def test_every_method_is_held_to_the_criterion_and_aligned_ones_to_p_up():
    rows = [_measured("bct", 0.1, 0.3, p_up=(0.0, -0.04)),
            _measured("hoc", 0.1, 0.3, p_up=(0.0, -0.06)),                      # P_up mAP below −0.05
            _measured("l2", 0.1, 0.3, p_up=(-0.3, -0.3)),                       # P_up is not a target
            _measured("dsimplex", 0.1, 0.3, compatible=(False, True))]
    verdicts = compatibility.method_targets(rows)
    assert verdicts == {"bct": {"criterion": True, "p_up": True}, "hoc": {"criterion": True, "p_up": False},
                        "l2": {"criterion": True, "p_up": None}, "dsimplex": {"criterion": False, "p_up": True}}
    # the table judges the mean update (P_up from the seed means): hbct mAP (0.6 − 0.3525)/0.3525
    lines = compatibility.format_method_targets(_TWO_SEEDS).splitlines()
    assert lines[2:] == ["| hbct | 2 / 2 | passes / passes | +0.00 / +0.70 | yes |",
                         "| bct | 2 / 2 | passes / passes | +0.00 / +0.00 | yes |"]


def test_the_cost_table_gives_the_mean_update_and_the_median_time_over_the_control():
    """docs/methods.md's per-method table: mAP of the mean update, and the median over seeds of each
    new model's training time over ``independent``'s in the same table (a seed trained beside another
    load moves no median; seeds measured on different machines compare)."""
    def timed(row, seconds):
        return {**row, "train_s": seconds}

    tables = [[timed(_update("bct", 0.20, 0.60, 0.60, 0.36), 22.0), timed(_update("independent", 0.20, 0.60, 0.60, 0.05), 20.0)],
              [timed(_update("bct", 0.30, 0.60, 0.60, 0.45), 90.0), timed(_update("independent", 0.30, 0.60, 0.60, 0.05), 21.0)],
              [timed(_update("bct", 0.20, 0.60, 0.60, 0.36), 23.0), timed(_update("independent", 0.20, 0.60, 0.60, 0.05), 19.0)]]
    lines = compatibility.format_method_costs(tables).splitlines()
    # bct: median of 22/20, 90/21, 23/19 = 1.21; mAP means: self 0.6, cross 0.39, old 0.7/3
    assert lines[2] == "| `bct` | 0.600 / 0.390 / 0.233 | +0.00 / +0.00 | passes / passes | 1.21× |"
    assert lines[3].endswith("| 1.00× |")
    # one seed on a 100× faster machine: median of 2.2/2.0, 260/200, 280/250 = 1.12 (not 260 s / 200 s)
    mixed = [[timed(row, seconds) for row, seconds in zip(table, times)]
             for table, times in zip(tables, [(2.2, 2.0), (260.0, 200.0), (280.0, 250.0)])]
    assert compatibility.format_method_costs(mixed).splitlines()[2].endswith("| 1.12× |")
    untimed = [[_update("bct", 0.20, 0.60, 0.60, 0.36)]]
    assert compatibility.format_method_costs(untimed).splitlines()[2].endswith("| – |")


def test_stored_tables_are_reported_together_and_a_bad_line_is_named(tmp_path, capsys):
    """Seeds measured apart (``--rows-out``, one JSON line each) are reported as one mean update
    (``--from-rows``), with the tables measured on each half of the classes (``--by-class-age``)."""
    def record(seed, tables):
        rows = [{**row, "by_classes": {"seen": {k: row[k] for k in ("cmc@1", "map")},
                                       "unseen": {k: row[k] for k in ("cmc@1", "map")}}} for row in tables]
        return json.dumps({"dataset": "shapes-60", "epochs": 4, "seed": seed, "rows": rows})

    stored = tmp_path / "rows.jsonl"
    stored.write_text("\n".join(record(seed, table) for seed, table in enumerate(_TWO_SEEDS)) + "\n")
    assert main(["--from-rows", str(stored)]) == 0
    out = capsys.readouterr().out
    assert "### shapes-60, 4 epochs: every method over seeds (2 tables)" in out
    assert format_table(compatibility.seed_means(_TWO_SEEDS)) in out
    assert "The mean update on the classes the old model was trained on:" in out
    assert "The mean update on the classes the old model never saw:" in out

    stored.write_text(record(0, _TWO_SEEDS[0]) + "\n{\"dataset\": \"digits\"}\n")
    with pytest.raises(ValueError, match=r"rows.jsonl:2: not a table of --rows-out \('epochs'\)"):
        compatibility.read_rows([stored])


def test_the_default_rows_are_every_registered_method_that_trains_its_encoder():
    from orchestrator.methods import available_methods
    # the post-hoc methods take a given encoder, which an update experiment does not have
    assert set(compatibility.DEFAULT_METHODS) == {name for name, description in available_methods().items()
                                                  if description.trains_encoder}
    labels = [row[0] for row in METHODS]
    assert len(labels) == len(set(labels)) and set(compatibility.DEFAULT_METHODS) <= set(labels)


@pytest.mark.parametrize("stored, table, seeds", [("compatibility_shapes60_e4_h200.jsonl", ("shapes-60", 4), 5),
                                                   ("compatibility_digits_e20_cpu.jsonl", ("digits", 20), 5),
                                                   ("compatibility_shapes60_e4_cpu_prototypes.jsonl", ("shapes-60", 4), 5),
                                                   ("compatibility_digits_e20_cpu_prototypes.jsonl", ("digits", 20), 5),
                                                   ("compatibility_shapes60_e8.jsonl", ("shapes-60", 8), 5)])
def test_the_readmes_issue_28_tables_are_the_stored_rows(stored, table, seeds):
    """benchmarks/README.md's issue-28 tables are what ``--from-rows`` reports from the rows the runs
    stored (so they cannot drift from the measurement)."""
    tables = compatibility.read_rows([REPO / "benchmarks" / "results" / stored])[table]
    assert len(tables) == seeds
    readme = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert compatibility.format_method_targets(tables) in readme
    assert format_table(compatibility.seed_means(tables)) in readme


def test_the_docs_digits_table_is_the_stored_rows():
    """docs/methods.md's table of every method on the digits (with its training cost) is what
    ``--from-rows`` reports from the stored five seeds."""
    tables = compatibility.read_rows([REPO / "benchmarks" / "results" / "compatibility_digits_e20_cpu.jsonl"])
    docs = (REPO / "docs" / "methods.md").read_text(encoding="utf-8")
    assert compatibility.format_method_costs(tables["digits", 20]) in docs
