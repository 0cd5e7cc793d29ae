"""The stage-work benchmark on a small gallery: the actor's work out of Ray embeds every item as the
plain loop does (the staged parts' embeddings equal the plain loop's), its parts add up, and the
summary is the arithmetic of its runs. No timing assertions: the figures are in
benchmarks/README.md."""
from __future__ import annotations

import json
import statistics

import pytest

from benchmarks import stage_work as bench


def test_both_paths_embed_the_same_items_and_the_summary_is_the_runs_arithmetic(tmp_path):
    out = tmp_path / "work.json"
    assert bench.main(["--items", "2500", "--runs", "2", "--batch-size", "64", "--workdir", str(tmp_path / "work"),
                       "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    # every item staged once (the same ids as the plain loop's) and embedded as the plain loop embeds it
    assert document["max_abs_difference"] == 0.0
    runs = document["runs"]
    assert len(runs) == 2 and all(set(run) == set(bench.PARTS) for run in runs)
    assert all(run[part] > 0 for run in runs for part in bench.PARTS)
    for run in runs:
        assert run["actor"] == pytest.approx(run["actor_read"] + run["actor_embed"] + run["actor_stage"])
    for part, figure in document["summary"].items():
        values = [run[part] for run in runs]
        assert figure == pytest.approx({"median": statistics.median(values), "min": min(values), "max": max(values)})
    assert not list((tmp_path / "work").glob("parts-*"))  # each run's staged parts removed
