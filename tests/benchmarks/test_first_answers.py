"""The first-answers benchmark's building blocks: one measured run of a real command, and the
table's medians and ratios against a hand computation. No timing assertions: the numbers only
mean something from a full run (benchmarks/README.md)."""
from __future__ import annotations

from pathlib import Path

from benchmarks.first_answers import Measurement, cases, format_table, measure

REPO = Path(__file__).resolve().parents[2]


def test_a_measured_run_reports_the_commands_exit_status_and_its_own_usage(tmp_path):
    missing = measure(["run", str(tmp_path / "nothing.yaml")], REPO)
    assert missing.status == 2  # a missing file is a usage error (docs/cli.md)
    assert missing.cpu_s > 0 and missing.wall_s > 0 and missing.peak_mb > 1  # a Python process's own usage
    assert measure(["--version"], REPO).status == 0


def test_the_cases_validate_or_refuse(tmp_path):
    found = cases(tmp_path)
    assert (tmp_path / "missing-field.yaml").is_file() and len(found) == 6
    statuses = {name: measure(argv, REPO).status for name, argv in found.items()}
    assert statuses == {name: 0 if name in ("schema", "--help") else 2 for name in found}
    assert not (tmp_path / "no-store").exists()  # the refusal of a missing store creates nothing


def test_the_table_shows_medians_and_first_to_last_ratios():
    runs = {"case": {"old": [Measurement(2, cpu, mb, 1.0) for cpu, mb in [(6.0, 900), (7.0, 1000), (9.0, 1100)]],
                     "new": [Measurement(2, cpu, mb, 1.0) for cpu, mb in [(0.5, 80), (0.4, 90), (0.7, 100)]]}}
    row = format_table(runs).splitlines()[2]
    assert row == "| case | 7.00 s, 1000 MB | 0.50 s, 90 MB | 14.0× | 11.1× |"  # 7.0 / 0.5, 1000 / 90
