"""The serve load benchmark's arithmetic and guards (the full run, on a served pipeline, is
tests/pipeline/test_serve_load_run.py). No timing assertions: the numbers only mean something from a
full run (benchmarks/README.md)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from benchmarks import serve_load


def test_a_row_reports_the_rate_and_the_nearest_rank_percentiles():
    latencies = list(np.random.default_rng(0).permutation(np.arange(1, 201) / 1000))  # 1 … 200 ms
    row = serve_load.Load(latencies, failed=3, seconds=4.0, mixed=1, snapshots={"a", "b"}).row("serve", 1000, "flat")
    assert row["qps"] == pytest.approx(50.0) and row["requests"] == 200
    assert row["p50_ms"] == pytest.approx(101.0) and row["p99_ms"] == pytest.approx(199.0)  # ranks 100 and 198 of 0…199
    assert (row["failed"], row["mixed"], row["snapshots"]) == (3, 1, 2)
    table = serve_load.table([row])
    assert table.splitlines()[2] == "| 1,000 | flat | serve | 50 | 101.0 | 199.0 | 200 | 3 | 1 | 2 |"


def test_the_client_loads_only_a_loopback_server():
    with pytest.raises(ValueError, match="only loads a server on 127.0.0.1"):
        asyncio.run(serve_load.closed_loop("http://10.0.0.5:8000", np.zeros((1, 3), np.float32), 1.0, 1))


def test_items_map_to_the_shard_the_gallery_split_put_them_in():
    starts = serve_load._starts(10, 4)  # np.array_split: 3, 3, 2, 2 items
    assert starts.tolist() == [0, 3, 6, 8]
    assert [int(np.searchsorted(starts, item, side="right") - 1) for item in (0, 2, 3, 7, 8, 9)] == [0, 0, 1, 2, 3, 3]


def test_a_response_is_consistent_only_with_what_its_snapshot_serves():
    starts = serve_load._starts(10, 2)  # items 0-4 in shard 0, 5-9 in shard 1
    served = {"s1": serve_load.Served("a", "a", frozenset()), "s2": serve_load.Served("b", "b", frozenset({3}))}

    def answer(snapshot, serving, *hits):
        return {"snapshot": snapshot, "serving": serving,
                "results": [[{"id": i, "shard": shard, "generation": g} for i, shard, g in hits]]}

    assert serve_load.consistent(answer("s1", "a", (3, 0, "a"), (7, 1, "a")), served, starts, 10)
    assert not serve_load.consistent(answer("s9", "a", (3, 0, "a")), served, starts, 10)  # a snapshot never held
    assert not serve_load.consistent(answer("s1", "b", (3, 0, "a")), served, starts, 10)  # another serving generation
    assert not serve_load.consistent(answer("s2", "b", (3, 0, "b")), served, starts, 10)  # an item it no longer holds
    assert not serve_load.consistent(answer("s2", "b", (7, 1, "a")), served, starts, 10)  # another snapshot's generation
    assert not serve_load.consistent(answer("s1", "a", (7, 0, "a")), served, starts, 10)  # outside its shard


def test_requests_during_a_switch_are_those_in_flight_in_its_window():
    load = serve_load.Load([1.0, 1.0, 1.0], 0, 10.0, answered=[(0.0, 1.0, "a"), (2.0, 3.0, "a"), (4.0, 5.0, "b")])
    during = load.during([(2.5, 4.5)])
    assert sorted(during.latencies) == [1.0, 1.0] and during.seconds == 2.0
