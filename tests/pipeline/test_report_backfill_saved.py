"""The served gallery's report rows (pipeline/report.py): backfill saved as served and along the
backfilling curve, each (served − old) / (full − old) of the row's own numbers."""
from __future__ import annotations

import pytest

from orchestrator.pipeline.report import gallery_report_rows


def _outputs(same: dict | None, curve: list | None) -> dict:
    metrics = {"cmc@1": 0.95, "cmc@5": 0.99, "map": 0.90}
    return {"serving": "g1", "mixed": metrics, "full_backfill": {"cmc@1": 0.98, "cmc@5": 0.99, "map": 0.95},
            "same_generation": same, "items_by_generation": {"g0": 270, "g1": 269},
            "search": {**metrics, "searched_items": 539, "gallery_items": 539},
            **({"curve": {"points": curve, "area": 0.9}} if curve else {})}


def test_backfill_saved_as_served_and_along_the_curve():
    same = {"generation": "g0", "cmc@1": 0.83, "cmc@5": 0.9, "map": 0.67}
    curve = [(0.0, 0.74), (0.5, 0.90), (1.0, 0.95)]
    row = gallery_report_rows([_outputs(same, curve)])[0]
    assert row["backfill saved map"] == pytest.approx((0.90 - 0.67) / (0.95 - 0.67))
    assert row["backfill saved cmc@1"] == pytest.approx((0.95 - 0.83) / (0.98 - 0.83))
    saved = row["curve backfill saved (map)"]
    assert [f for f, _ in saved] == [0.0, 0.5, 1.0]
    assert saved[0][1] == pytest.approx((0.74 - 0.67) / (0.95 - 0.67)) and saved[-1][1] == pytest.approx(1.0)


def test_no_baseline_or_no_gain_leaves_backfill_saved_out():
    first = gallery_report_rows([_outputs(None, None)])[0]
    assert first["backfill saved map"] is None and first["curve backfill saved (map)"] is None
    flat = {"generation": "g0", "cmc@1": 0.98, "cmc@5": 0.99, "map": 0.945}  # within a point of the full backfill
    row = gallery_report_rows([_outputs(flat, [(0.0, 0.9), (1.0, 0.95)])])[0]
    assert row["backfill saved map"] is None and row["backfill saved cmc@1"] is None
    assert [v for _, v in row["curve backfill saved (map)"]] == [None, None]
