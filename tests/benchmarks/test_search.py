"""The search benchmark on a tiny gallery: every method finds the same exact neighbours where it should,
the mAP@k helper against hand-computed values, leave-one-out, the ratio arithmetic and the report,
and ``main --json`` end to end. No timing assertions: the numbers only mean something from a full run
(benchmarks/README.md)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks import search
from orchestrator.geometry import poincare

# OPQ trains for ~15 s even on a tiny gallery; the index tests cover it
FAST_METHODS = ("euclidean_flat", "lorentz_flat", "arcosh_torch", "binary", "binary_weighted", "binary_two_stage",
                "pq", "binary_faiss", "binary_weighted_faiss")


@pytest.fixture(scope="module")
def bench():
    """The benchmark's module (benchmarks/search.py runs its ``main``)."""
    return search


def test_generated_points_lie_in_the_ball(bench):
    points = bench.generated_points(1000, 16, seed=0, chunk=300)
    assert points.shape == (1000, 16) and points.dtype == np.float32
    assert (np.linalg.norm(points, axis=1) < 1 / np.sqrt(bench.CURV)).all()
    hyperboloid = torch.from_numpy(bench.to_lorentz(points, chunk=300)).double()
    np.testing.assert_allclose(-hyperboloid[:, 0] ** 2 + (hyperboloid[:, 1:] ** 2).sum(1), -1 / bench.CURV, rtol=1e-5)


def test_exact_methods_agree(bench):
    points = bench.generated_points(3000, 16, seed=1)
    queries = bench.generated_points(5, 16, seed=2)
    exact = poincare.pairwise_distance(torch.from_numpy(queries).double(), torch.from_numpy(points).double(), bench.CURV)
    reference = exact.topk(10, largest=False).indices.numpy()
    for name in ("lorentz_flat", "arcosh_torch"):
        searcher = bench.build_searcher(name, points)
        _, found = searcher.search(searcher.prepare(queries), 10)
        np.testing.assert_array_equal(np.asarray(found), reference)
    # the chunked torch top-k crosses chunk borders (chunk 65,536 > 3,000: force small chunks)
    small = bench.TORCH_CHUNK
    try:
        bench.TORCH_CHUNK = 700
        distances, rows = bench.arcosh_top_k(torch.from_numpy(queries), torch.from_numpy(points), 10)
    finally:
        bench.TORCH_CHUNK = small
    np.testing.assert_array_equal(rows.numpy(), reference)
    np.testing.assert_allclose(distances.numpy(), exact.topk(10, largest=False).values.numpy(), rtol=1e-5)
    # the FAISS-only binary row returns the same neighbours as the binary index (raw Hamming units)
    kernel = bench.build_searcher("binary_faiss", points)
    wrapped = bench.build_searcher("binary", points)
    hamming, kernel_rows = kernel.search(kernel.prepare(queries), 10)
    distances, wrapped_rows = wrapped.search(wrapped.prepare(queries), 10)
    np.testing.assert_array_equal(kernel_rows, wrapped_rows)
    step_squared = distances[hamming > 0] / hamming[hamming > 0]
    np.testing.assert_allclose(step_squared, step_squared[0], rtol=1e-12)  # distances = s² · Hamming
    assert kernel.item_bytes == wrapped.item_bytes == 4 and kernel.memory_bytes == wrapped.memory_bytes == 3000 * 4


def test_map_at_k_by_hand(bench):
    found = np.array([[1, 0, 1, 0], [0, 0, 0, 0], [2, 2, 1, 2]])
    # query 0: hits at ranks 1, 3 -> (1/1 + 2/3) / 2; query 1 (label 1): none -> 0; query 2: ranks 1, 2, 4 -> (1 + 1 + 3/4) / 3
    expected = ((1 + 2 / 3) / 2 + 0 + (1 + 1 + 0.75) / 3) / 3
    assert bench.mean_average_precision_at_k(found, np.array([1, 1, 2])) == pytest.approx(expected)
    assert bench.mean_average_precision_at_k(np.array([[5, 5]]), np.array([5])) == 1.0


def test_leave_one_out(bench):
    found = np.array([[7, 3, 9], [4, 2, 8], [1, 5, 6]])
    np.testing.assert_array_equal(bench.leave_one_out(found, np.array([7, 8, 0]), 2), [[3, 9], [4, 2], [1, 5]])


def test_single_query_budget_and_medians(bench):
    calls = []
    searcher = bench.Searcher("euclidean_flat", lambda q, k: calls.append(len(q)), np.asarray, 10, 1.0, 0.0)
    timing = bench.time_searches(searcher, np.zeros((30, 2)), single=25, batch=7, single_budget_s=0.0)
    assert timing["single_calls"] == 10 and timing["batch_queries"] == 7  # budget spent: stop after 10 calls
    assert calls == [1] + [1] * 10 + [1, 7]  # warm-ups of one query before each regime
    assert timing["single_qps"] == pytest.approx(10 / timing["single_s"])
    assert bench.time_searches(searcher, np.zeros((3, 2)), single=25, batch=2, single_budget_s=60.0)["single_calls"] == 25
    runs = [{"single_calls": 10, "batch_queries": 7, "single_qps": q, "batch_qps": b} for q, b in [(3, 9), (1, 7), (2, 8)]]
    median = bench.median_timing(runs)
    assert (median["single_qps"], median["batch_qps"], median["runs"]) == (2, 8, runs)


def test_paired_ratios_and_memory_ratios(bench):
    base_runs = [{"single_qps": 100.0, "batch_qps": 1000.0}, {"single_qps": 50.0, "batch_qps": 1000.0},
                 {"single_qps": 80.0, "batch_qps": 500.0}]
    runs = [{"single_qps": 1000.0, "batch_qps": 2000.0}, {"single_qps": 600.0, "batch_qps": 1500.0},
            {"single_qps": 400.0, "batch_qps": 1500.0}]
    ratios = bench.paired_ratios(runs, base_runs)
    assert ratios["single_ratios"] == pytest.approx([10.0, 12.0, 5.0]) and ratios["single_ratio"] == pytest.approx(10.0)
    assert ratios["batch_ratios"] == pytest.approx([2.0, 1.5, 3.0]) and ratios["batch_ratio"] == pytest.approx(2.0)
    with pytest.raises(ValueError):
        bench.paired_ratios(runs, base_runs[:2])
    rows = bench.add_memory_ratios([{"method": "euclidean_flat", "memory_bytes": 512_000},
                                    {"method": "binary", "memory_bytes": 32_000}])
    assert (rows[1]["memory_ratio"], rows[1]["times_smaller"], rows[0]["times_smaller"]) == (1 / 16, 16.0, 1.0)


def test_targets(bench):
    rows = [
        {"method": "euclidean_flat", "single_ratio": 1.0, "batch_ratio": 1.0, "times_smaller": 1.0},
        {"method": "lorentz_flat", "single_ratio": 0.95, "batch_ratio": 0.8, "times_smaller": 0.98},
        {"method": "binary", "single_ratio": 10.0, "batch_ratio": 2.0, "times_smaller": 16.0},
        {"method": "binary_weighted", "single_ratio": 7.0, "batch_ratio": 1.5, "times_smaller": 6.4},
    ]
    quality = [{"method": "lorentz_flat", "gap": 0.0}, {"method": "binary", "gap": -0.004},
               {"method": "binary_weighted", "gap": -0.002}]
    verdicts = {v["method"]: v for v in bench.targets({1000: rows}, quality)}
    assert verdicts["lorentz_flat"]["met"] and verdicts["binary"]["met"]
    assert not verdicts["binary_weighted"]["met"]  # 7× faster and 6.4× smaller
    rows[1]["single_ratio"] = 0.89
    assert not bench.targets({1000: rows}, quality)[0]["met"]
    assert not bench.targets({1000: rows}, [{"method": "binary", "gap": -0.02}])[1]["met"]  # mAP gap
    assert not bench.targets({1000: rows}, None)[1]["met"]  # no quality measured: not met
    text = bench.format_targets(bench.targets({1000: rows}, quality))
    assert "binary: speed >= 8x" in text and "NOT met" in text and "10.00×" in text


def test_main_quick_writes_the_tables_and_json(bench, tmp_path, capsys):
    out = tmp_path / "search.json"
    assert bench.main(["--quick", "--sizes", "600", "--single", "5", "--batch", "8", "--repeat", "2", "--quality-limit", "128",
                       "--methods", ",".join(FAST_METHODS), "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    rows = document["speed"]["600"]
    assert [row["method"] for row in rows] == list(FAST_METHODS)
    base = rows[0]
    others = len(FAST_METHODS) - 1
    assert len(base["runs"]) == 2 * others and base["single_ratio"] == base["batch_ratio"] == 1.0
    for j, row in enumerate(rows[1:]):
        assert row["n"] == 600 and row["batch_queries"] == 8 and row["single_calls"] == 5 and len(row["runs"]) == 2
        assert row["single_qps"] == pytest.approx(np.median([run["single_qps"] for run in row["runs"]]))
        # run r of this method was paired with the baseline run timed just before it
        paired = [base["runs"][r * others + j] for r in range(2)]
        assert row["single_ratios"] == pytest.approx([m["single_qps"] / b["single_qps"] for m, b in zip(row["runs"], paired)])
        assert row["batch_ratios"] == pytest.approx([m["batch_qps"] / b["batch_qps"] for m, b in zip(row["runs"], paired)])
        assert row["single_ratio"] == pytest.approx(np.median(row["single_ratios"]))
        assert row["times_smaller"] == pytest.approx(base["memory_bytes"] / row["memory_bytes"])
    by_method = {row["method"]: row for row in rows}
    assert by_method["euclidean_flat"]["memory_bytes"] == 600 * 128 * 4
    assert by_method["binary"]["memory_bytes"] == 600 * 32 and by_method["binary_weighted"]["item_bytes"] == 80
    quality = {row["method"]: row for row in document["quality"]["rows"]}
    assert set(quality) == set(FAST_METHODS) - {"binary_faiss", "binary_weighted_faiss"}
    assert quality["lorentz_flat"]["gap"] == 0.0
    assert all(0.0 <= row["map_at_50"] <= 1.0 for row in quality.values())
    assert quality["arcosh_torch"]["map_at_50"] == pytest.approx(quality["lorentz_flat"]["map_at_50"], abs=0.01)
    assert {v["method"] for v in document["targets"]} == {"lorentz_flat", "binary", "binary_weighted", "binary_two_stage"}
    printed = capsys.readouterr().out
    assert "N = 600 (128-d, k = 50" in printed and "mAP@50" in printed and "target N=600 binary" in printed
