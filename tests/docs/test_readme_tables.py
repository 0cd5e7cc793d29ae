"""The README's result tables are what ``docs/readme_tables.py`` makes of the stored report of a
default run (``tests/docs/readme_report/``: the report files ``orchestrator run
pipelines/lifelong.yaml`` wrote), so the README cannot drift from what the code printed."""
from __future__ import annotations

import csv
import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REPORT = Path(__file__).resolve().parent / "readme_report"
README = REPO / "README.md"


def _generator():
    spec = importlib.util.spec_from_file_location("readme_tables", REPO / "docs" / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_tables_are_the_generated_ones():
    generator = _generator()
    text = README.read_text(encoding="utf-8")
    names = [m.group("name") for m in generator.BLOCK.finditer(text)]
    assert names == ["updates", "map-matrix", "served", "backfill"]
    assert generator.rewrite(text, generator.tables(REPORT)) == text, (
        "README.md's tables differ from the stored report: python3 docs/readme_tables.py tests/docs/readme_report "
        "--write README.md (or store a new run's report there)")


def _cells(table: str, first: str) -> list[str]:
    """The cells after the first one of the row whose first cell is ``first``."""
    row = next(line for line in table.splitlines() if line.startswith(f"| {first} |"))
    return [cell.strip() for cell in row.strip("|").split("|")][1:]


def test_the_tables_agree_with_the_csv_files_the_run_wrote_beside_the_json():
    """The mAP matrix against ``compatibility.csv`` (written from the same evaluation, rounded to 6
    places), the served mAP after g1's 50 % backfill against g1's backfilling curve at 0.5."""
    tables = _generator().tables(REPORT)
    with (REPORT / "compatibility.csv").open(newline="") as file:
        for row in csv.DictReader(file):
            generations = json.loads((REPORT / "compatibility.json").read_text())["generations"]
            cell = _cells(tables["map-matrix"], f"**{row['query_generation']}**")[generations.index(row["gallery_generation"])]
            assert cell == f"{float(row['map']):.3f}"
    with (REPORT / "backfill-digits-test-g1.csv").open(newline="") as file:
        at_half = next(float(r["map"]) for r in csv.DictReader(file) if float(r["fraction"]) == 0.5)
    served = _cells(tables["served"], "g1 (50 % of items, most uncertain first)")
    assert served[2] == f"{at_half:.3f}" == "0.912"
    assert served[0] == "g0-old: 270, g1: 269"


def test_check_fails_on_a_changed_number_and_write_restores_it(tmp_path, capsys):
    generator = _generator()
    readme = tmp_path / "README.md"
    original = README.read_text(encoding="utf-8")
    readme.write_text(re.sub(r"\| 0\.912 \|", "| 0.913 |", original, count=1), encoding="utf-8")
    assert generator.main([str(REPORT), "--check", str(readme)]) == 1
    assert "differ" in capsys.readouterr().err
    assert generator.main([str(REPORT), "--write", str(readme)]) == 0
    assert readme.read_text(encoding="utf-8") == original
    assert generator.main([str(REPORT), "--check", str(readme)]) == 0


def test_an_unknown_table_name_is_an_error():
    generator = _generator()
    with pytest.raises(ValueError, match="'served-gallery': no such table"):
        generator.rewrite("<!-- readme-table:served-gallery -->\nold\n<!-- /readme-table:served-gallery -->\n",
                          generator.tables(REPORT))
