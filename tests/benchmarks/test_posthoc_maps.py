"""The post-hoc maps' table (benchmarks/posthoc_maps.py) on hand-made rows; the measurement itself
runs on a posthoc.yaml run (docs/methods.md)."""
from __future__ import annotations

from benchmarks.posthoc_maps import format_rows
from orchestrator.metrics import update_summary


def test_rows_are_cmc_then_map_with_backfill_saved_and_the_fit():
    row = {"adapter": "procrustes", "pairs": 500, "seconds": 0.012, "parameters": 1024,
           "cmc@1": update_summary(0.9, 0.85, 0.8), "map": update_summary(0.8, 0.7, 0.75)}
    lines = format_rows([row]).splitlines()
    assert lines[0].startswith("| map | pairs | parent self | given self | cross (through the map) | criterion |")
    saved_cmc = (0.85 - 0.8) / (0.9 - 0.8)
    assert lines[2] == ("| procrustes | 500 | 0.800 / 0.750 | 0.900 / 0.800 | 0.850 / 0.700 | passes / fails | "
                        f"{saved_cmc:+.2f} / -1.00 | 0.01 s | 1,024 |")


def test_an_undefined_backfill_saved_is_na():
    row = {"adapter": "residual_mlp", "pairs": 100, "seconds": 1.5, "parameters": 9,
           "cmc@1": update_summary(0.8, 0.85, 0.8), "map": update_summary(0.75, 0.7, 0.75)}  # no gain to share
    assert "| n/a / n/a |" in format_rows([row])


def test_the_query_cost_measures_every_map_through_the_comparison_path():
    """One row per map (slerp's with the old generation's queries, as the router passes them) and
    the old encoder's pass; the figures themselves are the benchmark's, not checked here."""
    from benchmarks.posthoc_maps import format_cost, query_cost

    rows = query_cost(batch=4, dim=8, repeats=2, image_size=16)
    assert [row["what"].split(":")[0] for row in rows] == ["procrustes", "low_rank_affine", "residual_mlp", "slerp",
                                                           "slerp"]
    assert all(row["batch_us"] > 0 and row["single_us"] > 0 for row in rows)
    assert format_cost(rows, 4).splitlines()[0] == "| per query | in a batch of 4 | alone |"
