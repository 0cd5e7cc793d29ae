"""The cross-architecture upgrade (benchmarks/cross_arch.py, ``compatibility.py --upgrade cross-arch``):
its rows on a small experiment, its table on hand-made records, and benchmarks/README.md's section
against the stored rows."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from benchmarks import compatibility, cross_arch
from orchestrator.data import load_digits
from orchestrator.evaluation.update_experiment import ExperimentSettings, UpdateExperiment
from orchestrator.metrics import update_summary
from orchestrator.training.config import TrainConfig

REPO = Path(__file__).resolve().parents[2]
#: Every stored record of this upgrade, in the order the README's command reads them (file names sorted).
STORED = sorted((REPO / "benchmarks" / "results").glob("compatibility_cross_arch_*.jsonl"))


def _row(method: str, new: float, cross: float, old: float = 0.5, reference: float = 0.8, fit_s: float = 1.0) -> dict:
    summary = {**update_summary(new, cross, old, reference), "reference_self": reference}
    return {"method": method, "fit_s": fit_s, "cmc@1": summary, "map": summary}


def _record(seed: int, *rows: dict, dataset: str = "digits") -> dict:
    return {"upgrade": "cross-arch", "dataset": dataset, "epochs": 20, "seed": seed, "old_arch": "test_resnet",
            "new_arch": "test_convnext", "device": "cpu", "rows": list(rows)}


def _cells(table: str, method: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {method} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_table_counts_the_criterion_and_gives_mean_and_sd_over_seeds():
    crosses, fits = [0.6, 0.45, 0.7], [0.2, 0.4, 0.3]
    records = [_record(seed, _row("procrustes", 0.8, cross, fit_s=fit)) for seed, (cross, fit) in enumerate(zip(crosses, fits))]
    cells = _cells(cross_arch.section(records), "procrustes")
    assert cells[1] == "2 of 3 (2 / 2)"  # cross 0.45 is below the old model's 0.5
    saved = [(cross - 0.5) / (0.8 - 0.5) for cross in crosses]  # backfill saved; the reference is the new model
    expected = f"{np.mean(saved):+.2f} ± {np.std(saved, ddof=1):.2f}"
    assert cells[3] == cells[5] == f"{expected} / {expected}"  # P_com equals backfill saved when φ_* is φ_n
    assert cells[4] == "+0.00 ± 0.00 / +0.00 ± 0.00"
    assert cells[6] == f"{np.mean(fits):.2f} ± {np.std(fits, ddof=1):.2f}"
    assert cells[2] == f"0.500 / 0.800 / {np.mean(crosses):.3f}"


def test_undefined_values_are_counted_and_one_seed_has_no_sd():
    records = [_record(0, _row("slerp", 0.5, 0.6)), _record(1, _row("slerp", 0.8, 0.7))]  # seed 0: no gain to share
    cells = _cells(cross_arch.section(records), "slerp")
    assert cells[5] == f"{(0.7 - 0.5) / 0.3:+.2f} (1 of 2) / {(0.7 - 0.5) / 0.3:+.2f} (1 of 2)"
    assert cross_arch.spread([0.25]) == "+0.25"


def test_a_seed_measured_again_counts_once_and_each_dataset_has_its_table():
    records = [_record(0, _row("fct", 0.8, 0.4)), _record(0, _row("fct", 0.8, 0.7)),
               _record(1, _row("fct", 0.8, 0.6), dataset="shapes-60")]
    text = cross_arch.section(records)
    assert "**digits, 20 epochs, test_resnet → test_convnext**, seeds 0 (1 seeds; cpu):" in text
    assert "**shapes-60, 20 epochs, test_resnet → test_convnext**, seeds 1 (1 seeds; cpu):" in text
    assert text.count("| fct | 1 of 1 (1 / 1) |") == 2


def test_from_rows_rewrites_the_readme_section_and_refuses_a_foreign_record(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(_record(0, _row("procrustes", 0.8, 0.6))) + "\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{cross_arch.BEGIN}\nstale\n{cross_arch.END}\nafter\n")
    assert compatibility.main(["--upgrade", "cross-arch", "--from-rows", str(rows), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text == f"before\n{cross_arch.section([_record(0, _row('procrustes', 0.8, 0.6))])}\nafter\n"
    assert capsys.readouterr().out.strip() == text[text.index(cross_arch.BEGIN):text.index(cross_arch.END)
                                                   + len(cross_arch.END)]
    rows.write_text(json.dumps({**_record(0), "upgrade": "extended-class"}) + "\n")
    with pytest.raises(ValueError, match=r"rows.jsonl:1: not a --upgrade cross-arch record \(upgrade is 'extended-class'\)"):
        compatibility.main(["--upgrade", "cross-arch", "--from-rows", str(rows)])


def test_every_row_searches_the_same_old_gallery_and_slerp_at_0_is_procrustes():
    """A small cross-architecture upgrade (160 digits, one epoch): the maps share the given encoder
    (its self-test is the control's), every row the old model; slerp at t = 0 searches with the
    aligned query alone, which is the Procrustes row."""
    rng = np.random.default_rng(0)
    train, test = load_digits("train"), load_digits("test")
    settings = ExperimentSettings(embed_dim=8, image_size=32, new_arch="test_convnext",
                                  training=TrainConfig(epochs=1, batch_size=32, lr=0.05, augment=False, seed=3))
    settings = settings.model_copy(update={"health": settings.health.model_copy(update={"enabled": False})})
    experiment = UpdateExperiment(settings, train.subset(np.sort(rng.choice(len(train), 160, replace=False))),
                                  test.subset(np.sort(rng.choice(len(test), 60, replace=False))))
    maps = {**cross_arch.MAPS, "slerp t=0": ("slerp", {"weight": 0.0})}
    rows = {row["method"]: row for row in cross_arch.measure(experiment, maps=maps)}
    assert list(rows) == [cross_arch.CONTROL_LABEL, "lambda_orth", "fct", *maps]
    for metric in ("cmc@1", "map"):
        control = rows[cross_arch.CONTROL_LABEL][metric]
        assert len({row[metric]["old_self"] for row in rows.values()}) == 1
        assert all(rows[label][metric]["self"] == control["self"] for label in maps)
        assert all(row[metric]["reference_self"] == control["self"] for row in rows.values())
        assert rows["slerp t=0"][metric]["cross"] == pytest.approx(rows["procrustes"][metric]["cross"], abs=1e-9)
    assert all(row["fit_s"] > 0 for row in rows.values())


def test_a_cross_architecture_upgrade_needs_a_new_architecture():
    with pytest.raises(ValueError, match="needs settings.new_arch"):
        cross_arch.measure(UpdateExperiment(ExperimentSettings()))


def test_the_readme_section_is_the_stored_rows():
    """benchmarks/README.md's cross-architecture section is what ``--from-rows`` makes of the stored
    records, and its backfill-saved and P_com cells are the mean ± sd of the stored values."""
    records = compatibility.read_cross_arch(STORED)
    readme = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    section = cross_arch.section(records)
    assert section == readme[readme.index(cross_arch.BEGIN):readme.index(cross_arch.END) + len(cross_arch.END)]
    last = {record["seed"]: record for record in records if record["dataset"] == "digits"}
    assert len(last) >= 5
    digits = section[section.index("**digits"):]  # its table's rows come before any other dataset's
    for method in ("procrustes", "slerp", "lambda_orth", "fct"):
        found = [row for seed in sorted(last) for row in last[seed]["rows"] if row["method"] == method]
        cells = _cells(digits, method)
        for column, key in ((3, "p_com"), (5, "backfill_saved")):
            expected = []
            for metric in ("cmc@1", "map"):
                values = np.array([row[metric][key] for row in found], dtype=float)
                expected.append(f"{values.mean():+.2f} ± {values.std(ddof=1):.2f}")
            assert cells[column] == " / ".join(expected)
        met = sum(row["cmc@1"]["compatible"] and row["map"]["compatible"] for row in found)
        each = [sum(row[metric]["compatible"] for row in found) for metric in ("cmc@1", "map")]
        assert cells[1] == f"{met} of {len(found)} ({each[0]} / {each[1]})"
    assert re.search(r"seeds [0-9, ]+ \(\d+ seeds; cpu\)", section)
