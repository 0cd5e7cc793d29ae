"""The training-overhead benchmark's building blocks on a few batches: the plain loop (a) and the
orchestrator's local loop (b) (no Ray), the result structure and the samples each path counted.
No timing assertions: the numbers are only meaningful from a full run (benchmarks/README.md)."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks import train_overhead


@pytest.fixture(scope="module")
def bench():
    """The benchmark's module (benchmarks/train_overhead.py runs its ``main``)."""
    return train_overhead


def check_result(result: dict, path: str, epochs: int, samples: int) -> None:
    assert result["path"] == path
    assert [e["epoch"] for e in result["epochs"]] == list(range(epochs))
    assert all(e["samples"] == samples for e in result["epochs"])
    assert result["samples_per_epoch"] == samples and result["samples_total"] == samples * epochs
    for key in ("steady_epoch_seconds", "steady_samples_per_s", "mean_samples_per_s", "wall_seconds"):
        assert result[key] > 0 and math.isfinite(result[key]), key
    assert result["startup_seconds"] >= 0
    assert math.isfinite(result["final_loss"])
    json.dumps(result)  # what --json writes


def test_plain_and_local_loops_count_the_items_they_train_on(bench, tmp_path):
    setup = bench.make_setup("independent", epochs=1, limit=200, workdir=tmp_path)
    assert len(setup.data) == 200
    expected = (200 // setup.training.batch_size) * setup.training.batch_size  # 3 full batches: the rest is dropped
    plain, local = bench.run_plain(setup), bench.run_local(setup)
    check_result(plain, "plain", 1, expected)
    check_result(local, "local", 1, expected)
    # same initial weights, same first shuffle, same objective: the two loops do the same work
    assert plain["epochs"][0]["loss"] == pytest.approx(local["epochs"][0]["loss"], rel=1e-4)
    ratios = bench.ratios({"plain": plain, "local": local})
    assert set(ratios) == {"local/plain"} and ratios["local/plain"] > 0
    table = bench.format_table({"plain": plain, "local": local})
    assert "(a) plain PyTorch loop" in table and "(b)/(a)" in table


def test_bct_trains_a_parent_first_and_both_loops_use_it(bench, tmp_path):
    setup = bench.make_setup("bct", epochs=1, limit=150, parent_epochs=1, workdir=tmp_path)
    assert setup.parent is not None and (tmp_path / "parent").is_dir() and len(setup.parent_sha256) == 64
    plain, local = bench.run_plain(setup), bench.run_local(setup)
    check_result(plain, "plain", 1, 128)
    check_result(local, "local", 1, 128)
    assert plain["epochs"][0]["loss"] == pytest.approx(local["epochs"][0]["loss"], rel=1e-4)


def test_main_writes_the_json_result_without_ray(bench, tmp_path, capsys):
    out = tmp_path / "result.json"
    assert bench.main(["--epochs", "1", "--limit", "130", "--paths", "plain,local", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert set(document["results"]) == {"plain", "local"}
    assert document["results"]["plain"]["samples_per_epoch"] == 128
    assert document["config"]["items"] == 130 and document["target"]["met"] is None
    assert "local/plain" in document["ratios"]
    assert "(b) orchestrator local loop" in capsys.readouterr().out


def test_checkpoint_times_are_the_newest_file_of_each_checkpoint(bench, tmp_path):
    import os

    for index, stamp in enumerate((100.0, 105.0, 103.0)):
        folder = tmp_path / f"checkpoint_00000{index}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x")
        os.utime(folder / "model.safetensors", (stamp, stamp))
    (tmp_path / "checkpoint_manager_snapshot.json").write_text("{}")  # a file, not a checkpoint
    assert bench.checkpoint_times(tmp_path) == [100.0, 103.0, 105.0]


def test_a_ray_path_summary_from_epoch_end_times(bench):
    """(c) and (d) share one summary: epochs end at 110, 112, 113.5, 115 s after a call at 100 s
    that returned at 116 s; worked out by hand: intervals 2, 1.5, 1.5 (median 1.5, fastest 1.5),
    start-up (110 − 100) − 1.5 = 8.5, tail 1, wall 16, 64 samples per epoch → 64 / 1.5 per s."""
    summary = bench._ray_summary("ray_local", {"samples": 64, "loss": 0.5}, [110.0, 112.0, 113.5, 115.0],
                                 fit_called=100.0, fit_returned=116.0)
    assert [e["seconds"] for e in summary["epochs"]] == [None, 2.0, 1.5, 1.5]
    assert summary["steady_epoch_seconds"] == 1.5 and summary["fastest_epoch_seconds"] == 1.5
    assert summary["steady_samples_per_s"] == pytest.approx(64 / 1.5)
    assert (summary["startup_seconds"], summary["tail_seconds"], summary["wall_seconds"]) == (8.5, 1.0, 16.0)
    assert summary["path"] == "ray_local" and summary["final_loss"] == 0.5 and summary["samples_total"] == 256
