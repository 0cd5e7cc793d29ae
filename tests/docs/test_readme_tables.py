"""The README's result tables are what ``docs/readme_tables.py`` makes of the stored reports of the
default run over several seeds (``tests/docs/readme_reports/seed-<n>/``: the report files
``orchestrator run pipelines/lifelong.yaml --set generations.<i>.training.seed=<n>`` wrote), so the
README cannot drift from what the code printed; ``--check`` accepts a run inside the seeds' spread
and names every number outside it."""
from __future__ import annotations

import csv
import importlib.util
import json
import random
import re
import shutil
import statistics
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEEDS = Path(__file__).resolve().parent / "readme_reports"
README = REPO / "README.md"


def _generator():
    spec = importlib.util.spec_from_file_location("readme_tables", REPO / "docs" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _seed_folders() -> list[Path]:
    return sorted(SEEDS.glob("seed-*"), key=lambda p: int(p.name.removeprefix("seed-")))


def test_the_readme_shows_five_or_more_seeds_and_its_tables_are_the_generated_ones():
    generator = _generator()
    seeds = generator.stored_seeds()
    assert seeds == _seed_folders() and len(seeds) >= 5
    text = README.read_text(encoding="utf-8")
    names = [m.group("name") for m in generator.BLOCK.finditer(text)]
    assert names == ["updates", "map-matrix", "served", "backfill"]
    assert generator.rewrite(text, generator.tables(seeds)) == text, (
        "README.md's tables differ from the stored seeds: python3 docs/readme_tables.py "
        "tests/docs/readme_reports/seed-* --write README.md (or store new runs' reports there)")


def _cells(table: str, first: str) -> list[str]:
    """The cells after the first one of the row whose first cell is ``first``."""
    row = next(line for line in table.splitlines() if line.startswith(f"| {first} |"))
    return [cell.strip() for cell in row.strip("|").split("|")][1:]


def test_the_matrix_is_the_mean_and_sd_of_the_csv_files_each_run_wrote_beside_its_json():
    """Every mAP cell against ``compatibility.csv`` of each seed (written from the same evaluation,
    rounded to 6 places): mean ± sample standard deviation, computed here."""
    seeds = _seed_folders()
    matrix = _generator().tables(seeds)["map-matrix"]
    values: dict[tuple[str, str], list[float]] = {}
    for folder in seeds:
        with (folder / "compatibility.csv").open(newline="") as file:
            for row in csv.DictReader(file):
                if row["map"]:
                    values.setdefault((row["query_generation"], row["gallery_generation"]), []).append(float(row["map"]))
    generations = json.loads((seeds[0] / "compatibility.json").read_text())["generations"]
    assert len(values) == 10
    for (query, gallery), maps in values.items():
        assert len(maps) == len(seeds)
        cell = _cells(matrix, f"**{query}**")[generations.index(gallery)]
        mean, sd = (float(part) for part in cell.split(" ± "))
        assert mean == pytest.approx(statistics.fmean(maps), abs=5.1e-4)
        assert sd == pytest.approx(statistics.stdev(maps), abs=5.1e-4)


def test_each_stored_seed_lies_inside_the_spread_of_the_others(tmp_path, capsys):
    generator = _generator()
    seeds = _seed_folders()
    for left_out in seeds:
        others = tmp_path / left_out.name
        others.mkdir()
        for folder in seeds:
            if folder != left_out:
                shutil.copytree(folder, others / folder.name)
        assert generator.main([str(left_out), "--check", "--seeds", str(others)]) == 0, capsys.readouterr().err
        assert f"inside the spread of {len(seeds) - 1} seeds" in capsys.readouterr().out


def _run_like_seed_0(tmp_path: Path, g1_own_map: float, served_after_g2: float) -> Path:
    """Seed 0's report with g1's own mAP and the served mAP after g2's deployment replaced."""
    run = tmp_path / "reports"
    shutil.copytree(_seed_folders()[0], run)
    compatibility = json.loads((run / "compatibility.json").read_text())
    compatibility["updates"]["g0-old → g1"]["map"]["self"] = g1_own_map
    (run / "compatibility.json").write_text(json.dumps(compatibility))
    served = json.loads((run / "gallery-digits-test.json").read_text())
    next(row for row in served if row["serving"] == "g2")["search map"] = served_after_g2
    (run / "gallery-digits-test.json").write_text(json.dumps(served))
    return run


def test_the_other_cpus_run_of_the_issue_is_inside(tmp_path, capsys):
    """Issue 40's run on an AMD EPYC printed g1's own mAP 0.937 and the served gallery after g2
    0.955 (seed 0 here: 0.949 and 0.967): both lie inside the five seeds' spread."""
    assert _generator().main([str(_run_like_seed_0(tmp_path, 0.937, 0.955)), "--check"]) == 0, capsys.readouterr().err


def test_check_names_each_number_outside_the_spread(tmp_path, capsys):
    """g1's own mAP 0.1 below seed 0's and a served mAP of 0.85 after g2: outside any seed-like
    interval here; one line names each, the rest of the run is inside."""
    run = _run_like_seed_0(tmp_path, 0.85, 0.85)
    assert _generator().main([str(run), "--check"]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 2, lines
    assert "updates: g0-old → g1 (extended class) | mAP, new self: 0.850 outside [" in lines[0]
    assert "served: g2 (50 % of shards, the generation it searches worst first), mAP as served (search): 0.850" in lines[1]
    assert "(2 number(s) outside)" in captured.out


def test_the_prediction_interval_covers_one_more_draw_as_often_as_it_says():
    """Monte Carlo: n = 5 normal draws, then a sixth; the interval from the five holds the sixth
    with probability CONFIDENCE (0.99): 40,000 trials give 0.99 ± 0.0015 (3 binomial SEs)."""
    generator = _generator()
    draws = random.Random(7)
    trials, hits = 40_000, 0
    for _ in range(trials):
        values = [draws.gauss(0.9, 0.01) for _ in range(5)]
        low, high = generator.interval(values, digits=9)
        hits += low <= draws.gauss(0.9, 0.01) <= high
    assert abs(hits / trials - generator.CONFIDENCE) < 3 * (0.99 * 0.01 / trials) ** 0.5


def test_same_fails_on_a_changed_number_and_write_restores_it(tmp_path, capsys):
    generator = _generator()
    seeds = [str(p) for p in _seed_folders()]
    readme = tmp_path / "README.md"
    original = README.read_text(encoding="utf-8")
    changed = re.sub(r"\| (\d\.\d{3}) ± ", lambda m: f"| {float(m.group(1)) + 0.001:.3f} ± ", original, count=1)
    assert changed != original
    readme.write_text(changed, encoding="utf-8")
    assert generator.main([*seeds, "--same", str(readme)]) == 1
    assert "differ" in capsys.readouterr().err
    assert generator.main([*seeds, "--write", str(readme)]) == 0
    assert readme.read_text(encoding="utf-8") == original
    assert generator.main([*seeds, "--same", str(readme)]) == 0


def test_an_unknown_table_name_is_an_error():
    generator = _generator()
    with pytest.raises(ValueError, match="'served-gallery': no such table"):
        generator.rewrite("<!-- readme-table:served-gallery -->\nold\n<!-- /readme-table:served-gallery -->\n",
                          generator.tables(_seed_folders()[:2]))
