"""The driver-rows benchmark on a few rows: every staged row reaches the driver once, in both task
shapes, and its summary is the arithmetic of its runs. No timing assertions (benchmarks/README.md
has the figures)."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from benchmarks import driver_rows as bench


def test_a_block_becomes_one_part_row_naming_its_entry():
    row = bench.PartRows(0.0)(pa.table({"entry": [3], "row": [77], "payload": [b"x"]}))
    assert row.to_pylist() == [{"entry": 3, "uri": "parts/3/000000000077.arrow", "n_items": 2048}]


@pytest.mark.e2e
def test_every_row_reaches_the_driver_and_the_summary_is_the_runs_arithmetic(tmp_path):
    out = tmp_path / "rows.json"
    assert bench.main(["--rows", "10,30", "--blocks-per-task", "1,4", "--block-sleep", "0.05", "--idle-seconds", "0.5",
                       "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    runs = document["runs"]
    # drive() raises unless the driver received every row: with one block a task, and with four
    # blocks a task kept apart (each block above the 1 KiB target block size the run sets); each
    # shape with Ray Data's executor in its coordinator actor (the step's way), then in the driver
    shapes = [(10, 1, 0.0), (30, 1, 0.0), (10, 4, 0.0), (30, 4, 0.0), (20, 1, 0.05)]  # idle: 0.5 s ÷ 0.05 s × 2
    assert [(r["executor"], r["rows"], r["blocks_per_task"], r["block_sleep_s"]) for r in runs] == \
        [(executor, *shape) for executor in bench.EXECUTORS for shape in shapes]
    assert all(run["driver_cpu_s"] > 0 for run in runs)
    # the coordinator actor was found and read in each of its runs (its start-up alone is CPU)
    assert all((run["coordinator_cpu_s"] or 0) > 0 for run in runs if run["executor"] == "coordinator")
    assert all(run["coordinator_cpu_s"] is None for run in runs if run["executor"] == "driver")
    for executor, its_runs in zip(bench.EXECUTORS, (runs[:5], runs[5:])):
        summary = document["summary"][executor]
        for shape, (small, large) in (("1", its_runs[0:2]), ("4", its_runs[2:4])):
            figures = summary["by_blocks_per_task"][shape]
            assert figures["driver_ms_per_row"] == pytest.approx((large["driver_cpu_s"] - small["driver_cpu_s"]) / 20 * 1e3)
            assert figures["rows_per_s"] == pytest.approx(30 / large["wall_s"])
            if executor == "coordinator":
                assert figures["coordinator_ms_per_row"] == \
                    pytest.approx((large["coordinator_cpu_s"] - small["coordinator_cpu_s"]) / 20 * 1e3)
        idle = its_runs[-1]
        assert summary["idle_driver_ms_per_s"] == pytest.approx(idle["driver_cpu_s"] / idle["wall_s"] * 1e3)
        assert idle["wall_s"] >= 20 * 0.05 / 2  # two actors sleeping 0.05 s a call: no faster than 40 rows a second
