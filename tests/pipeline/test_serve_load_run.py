"""benchmarks/serve_load.py end to end on a copy of the served g0-old run, small: every measurement
row is there, no request fails, no response mixes snapshots, and the shard commits, the deploy and
the rollback were served."""
from __future__ import annotations

import json

import pytest

from benchmarks import serve_load
from serving_client import free_port

pytestmark = pytest.mark.e2e


def test_the_load_benchmark_runs_and_its_switches_are_served(copy_g0_run, tmp_path):
    import ray

    pipeline = copy_g0_run(tmp_path)
    out = tmp_path / "load.json"
    try:
        assert serve_load.main([str(pipeline), "--items", "3000", "--kinds", "flat", "--seconds", "5", "--queries", "20",
                                "--commits", "2", "--concurrency", "2", "--port", str(free_port()), "--json", str(out),
                                "--search-replicas", "1"]) == 0
    finally:
        ray.shutdown()
    router, steady, switching, during = json.loads(out.read_text())
    name = "serve, 2 shard commits + deploy + rollback"
    assert [r["measure"] for r in (router, steady, switching, during)] == [
        "router (one process)", "serve", name, f"{name}: requests in flight during a switch"]
    assert all(r["items"] == 3000 and r["requests"] > 0 and r["failed"] == 0 and r["mixed"] == 0
               for r in (router, steady, switching, during))
    assert steady["snapshots"] == 1 and during["switches"] == 4  # two commits, the deploy, the rollback
    assert switching["snapshots"] == 1 + during["served_switches"] >= 2  # the start, then the switches as served
