"""The seed-collapse benchmark's verdict, counts and README section, on hand-made records."""
from __future__ import annotations

import json

import pytest

from benchmarks.compatibility import class_count
from benchmarks.seed_collapse import (
    BEGIN,
    END,
    collapse_counts,
    collapsed,
    format_collapse_table,
    format_mean_updates,
    format_seed_table,
    latest_rows,
    main,
    read_records,
    readme_section,
    unchecked,
)
from orchestrator.evaluation.update_experiment import UpdateExperiment
from orchestrator.metrics import update_summary


def _row(method: str, own: float, cross: float = 0.3, old: float = 0.25, reference: float = 0.5,
         num_classes: int = 10) -> dict:
    """A stored row: own / cross / old / φ_* the same on CMC@1 and mAP, its collapse verdict."""
    summary = {**update_summary(own, cross, old, reference), "old_self": old, "reference_self": reference}
    return {"method": method, "cmc@1": dict(summary), "map": dict(summary), "collapsed": collapsed(own, num_classes)}


def _record(stage: str, dataset: str, seed: int, *rows: dict, num_classes: int = 10) -> dict:
    return {"stage": stage, "commit": "abc1234" if stage == "before" else "def5678", "dataset": dataset,
            "epochs": 4, "seed": seed, "num_classes": num_classes, "rows": list(rows)}


#: advbct collapses on digits seed 1 before (own CMC@1 0.15 ≤ 2/10) and on shapes-60 seed 0 before
#: (0.02 ≤ 2/60); after, no seed collapses; bct never does and is measured before only.
_RECORDS = [
    _record("before", "digits", 0, _row("advbct", 0.80), _row("bct", 0.9)),
    _record("before", "digits", 1, _row("advbct", 0.15, cross=0.1), _row("bct", 0.9)),
    _record("before", "shapes-60", 0, _row("advbct", 0.02, cross=0.1, num_classes=60), num_classes=60),
    _record("before", "shapes-60", 1, _row("advbct", 0.30, num_classes=60), num_classes=60),
    _record("after", "digits", 0, _row("advbct", 0.85)),
    _record("after", "digits", 1, _row("advbct", 0.70)),
    _record("after", "shapes-60", 0, _row("advbct", 0.25, num_classes=60), num_classes=60),
    _record("after", "shapes-60", 1, _row("advbct", 0.40, num_classes=60), num_classes=60),
]


def test_a_collapse_is_own_cmc1_within_twice_chance():
    assert collapsed(0.2, 10) and not collapsed(0.21, 10)
    assert collapsed(1 / 30, 60) and not collapsed(0.034, 60)


def test_the_counts_per_method_dataset_and_stage():
    counts = collapse_counts(_RECORDS)
    assert counts["advbct", "digits", "before"] == (1, 2)
    assert counts["advbct", "shapes-60", "before"] == (1, 2)
    assert counts["advbct", "digits", "after"] == (0, 2)
    assert counts["bct", "digits", "before"] == (0, 2)
    assert ("bct", "digits", "after") not in counts


def test_a_seed_measured_again_at_one_stage_counts_once_its_last_record():
    again = _record("after", "digits", 0, _row("advbct", 0.1))
    assert collapse_counts([*_RECORDS, again])["advbct", "digits", "after"] == (1, 2)
    latest = latest_rows([*_RECORDS, again])
    assert latest[-1] == again and _RECORDS[4] not in latest and len(latest) == len(_RECORDS)
    section = readme_section([*_RECORDS, again], ["advbct"])
    assert section.count("| digits | after | 0 |") == 1 and "| digits | after | 0 | 0.100 /" in section
    assert "| digits | after | advbct | 2 | 2 |" in section  # the mean update of 2 seeds, not 3 records
    # a record measuring another method too keeps that row
    both = _record("before", "digits", 1, _row("advbct", 0.5), _row("lce", 0.9))
    assert latest_rows([_RECORDS[1], both]) == [
        {**_RECORDS[1], "rows": [_RECORDS[1]["rows"][1]]}, both]


def test_the_collapse_table_has_a_column_per_dataset_and_stage():
    lines = format_collapse_table(_RECORDS).splitlines()
    assert lines[0] == "| method | digits: before | digits: after | shapes-60: before | shapes-60: after |"
    # the registered methods in DEFAULT_METHODS' order: bct before advbct
    assert lines[2:] == ["| bct | 0 / 2 | – | – | – |", "| advbct | 1 / 2 | 0 / 2 | 1 / 2 | 0 / 2 |"]


def test_the_seed_table_marks_the_collapsed_seeds():
    lines = format_seed_table(_RECORDS, "advbct").splitlines()
    assert len(lines) == 2 + 8
    assert lines[2].startswith("| digits | before | 0 | 0.800 / 0.800 | 0.300 / 0.250 |")
    assert lines[2].endswith("| no |")
    # digits seed 1 before: P_up (0.15 − 0.5)/0.5 = −0.70, cross 0.1 < old 0.25 fails
    assert lines[3] == ("| digits | before | 1 | 0.150 / 0.150 | 0.100 / 0.250 | -0.70 / -0.70 | fails / fails | "
                        "**yes** |")
    assert [line.split(" | ")[1:3] for line in lines[2:]] == [
        ["before", "0"], ["before", "1"], ["after", "0"], ["after", "1"]] * 2


def test_the_mean_update_per_stage_is_of_the_seed_means():
    lines = format_mean_updates(_RECORDS, ["advbct"]).splitlines()
    # digits before: self (0.8 + 0.15)/2 = 0.475, cross 0.2, old 0.25, φ_* 0.5: fails, P_up −0.05
    assert lines[2] == ("| digits | before | advbct | 2 | 1 | fails / fails | -0.05 / -0.05 | "
                        "0.475 / 0.200 / 0.250 |")
    assert lines[3] == ("| digits | after | advbct | 2 | 2 | passes / passes | +0.55 / +0.55 | "
                        "0.775 / 0.300 / 0.250 |")
    assert len(lines) == 6


def test_the_readme_section_is_generated_from_stored_rows(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(record) + "\n" for record in _RECORDS))
    readme = tmp_path / "README.md"
    readme.write_text(f"# B\n\ntext before\n\n{BEGIN}\nstale\n{END}\n\ntext after\n")
    assert main(["--from-rows", str(rows), "--per-seed", "advbct", "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# B\n\ntext before\n\n" + BEGIN) and text.endswith(END + "\n\ntext after\n")
    assert "stale" not in text
    assert "before: abc1234; after: def5678" in text
    assert format_collapse_table(_RECORDS) in text and format_seed_table(_RECORDS, "advbct") in text
    assert capsys.readouterr().out.strip() == text[text.index(BEGIN):text.index(END) + len(END)]


def test_a_readme_without_the_markers_and_a_foreign_line_are_refused(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(record) + "\n" for record in _RECORDS))
    with pytest.raises(ValueError, match="no generated section"):
        main(["--from-rows", str(rows), "--readme", str(readme)])
    assert readme.read_text() == "# no markers\n"
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"dataset": "digits", "epochs": 4, "rows": []}) + "\n")
    with pytest.raises(ValueError, match=r"rows.jsonl:1: not a seed_collapse record"):
        read_records([rows])


def test_the_measurement_runs_with_the_health_check_off():
    """A collapsed model must be measured, not stopped: the benchmark turns the check off and keeps
    everything else of the experiment."""
    experiment = UpdateExperiment()
    assert experiment.settings.health.enabled
    quiet = unchecked(experiment)
    assert not quiet.settings.health.enabled
    assert quiet.settings.model_copy(update={"health": experiment.settings.health}) == experiment.settings
    assert quiet.train_images is experiment.train_images and quiet.eval_images is experiment.eval_images


def test_unknown_methods_are_refused():
    with pytest.raises(SystemExit):
        main(["--methods", "advbct,nope", "--datasets", "digits", "--seeds", "0"])


def test_records_of_compatibility_py_are_imported_with_the_same_verdict(tmp_path):
    """A compatibility.py record (no stage, commit, class count or verdict; extra rows) is stored as
    this benchmark's: the --methods rows only, C from the dataset's recipe, the verdict by the rule."""
    assert (class_count("digits"), class_count("shapes-60"), class_count("shapes")) == (10, 60, 24)
    plain = [{key: value for key, value in row.items() if key != "collapsed"}
             for row in (_row("advbct", 0.03, num_classes=60), _row("bct", 0.40, num_classes=60),
                         _row("advbct adv0.3", 0.01, num_classes=60))]
    source = tmp_path / "compatibility_shapes60_e4_h200.jsonl"
    source.write_text(json.dumps({"dataset": "shapes-60", "epochs": 4, "seed": 3, "seconds": 266.3,
                                  "device": "cuda", "rows": plain}) + "\n")
    out = tmp_path / "rows.jsonl"
    assert main(["--import-rows", str(source), "--methods", "advbct,bct", "--stage", "before",
                 "--commit", "77521cc", "--rows-out", str(out)]) == 0
    [record] = read_records([out])
    assert {k: record[k] for k in ("stage", "commit", "dataset", "epochs", "seed", "num_classes", "device")} == {
        "stage": "before", "commit": "77521cc", "dataset": "shapes-60", "epochs": 4, "seed": 3, "num_classes": 60,
        "device": "cuda"}
    assert record["imported_from"] == source.name
    assert [(row["method"], row["collapsed"]) for row in record["rows"]] == [("advbct", True), ("bct", False)]
    assert collapse_counts([record]) == {("advbct", "shapes-60", "before"): (1, 1),
                                         ("bct", "shapes-60", "before"): (0, 1)}
    source.write_text(json.dumps({"epochs": 4, "rows": plain}) + "\n")
    with pytest.raises(ValueError, match=r"h200.jsonl:1: not a compatibility.py record"):
        main(["--import-rows", str(source), "--stage", "before", "--commit", "x", "--rows-out", str(out)])
    with pytest.raises(SystemExit):
        main(["--import-rows", str(source), "--stage", "before", "--rows-out", str(out)])  # no commit

