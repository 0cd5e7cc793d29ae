"""benchmarks/serve_load.py end to end on a copy of the served g0-old run, small: every measurement
row is there, no request fails, no response mixes snapshots, the shard commits, the deploy and the
rollback were served, and the exact searches recall every true neighbour."""
from __future__ import annotations

import json
import os
from unittest import mock

import pytest

from benchmarks import serve_load
from serving_client import free_port

pytestmark = pytest.mark.e2e


def test_the_load_benchmark_runs_and_its_switches_are_served(copy_g0_run, tmp_path):
    import ray

    pipeline = copy_g0_run(tmp_path)
    out = tmp_path / "load.json"
    # the benchmark starts its Ray in direct ingress (as `serve` does), through this process's environment
    with mock.patch.dict(os.environ):
        try:
            assert serve_load.main([str(pipeline), "--items", "3000", "--kinds", "flat", "--seconds", "4", "--queries", "20",
                                    "--commits", "2", "--concurrency", "2", "--batch", "4", "--port", str(free_port()),
                                    "--json", str(out), "--modes", "pools", "--search-replicas", "1", "--fixed-cost"]) == 0
        finally:
            ray.shutdown()
    fixed, index, router, batched, plain, lance, steady, switching, during = json.loads(out.read_text())
    name = "serve, 2 shard commits + deploy + rollback"
    assert [r["measure"] for r in (fixed, index, router, batched, plain, lance, steady, switching, during)] == [
        "serve the run's own gallery, 2 clients, token on", "index alone (ShardIndex.search, every shard)",
        "router, one query per call", "router, 4 queries per call", "plain FAISS over HTTP, 2 clients",
        "Lance (embedded), one query per call", "serve, 2 clients", name, f"{name}: requests in flight during a switch"]
    assert fixed["items"] == 539 and fixed["requests"] > 0 and fixed["failed"] == 0
    measured = (index, router, batched, plain, lance, steady, switching, during)
    assert all(r["items"] == 3000 and r["requests"] > 0 and r["failed"] == 0 and r["mixed"] == 0 for r in measured)
    assert router["recall_at_10"] == batched["recall_at_10"] == lance["recall_at_10"] == 1.0  # exact searches
    assert steady["snapshots"] == 1 and during["switches"] == 4  # two commits, the deploy, the rollback
    assert switching["snapshots"] == 1 + during["served_switches"] >= 2  # the start, then the switches as served
    assert len(serve_load.verdicts(json.loads(out.read_text()))) == 4  # router, served, switching, fixed cost
