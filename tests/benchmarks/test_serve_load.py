"""The serve load benchmark's arithmetic and guards (the full run, on a served pipeline, is
tests/pipeline/test_serve_load_run.py). No timing assertions: the numbers only mean something from a
full run (benchmarks/README.md)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from benchmarks import serve_load
from benchmarks.harness import replace_section


def test_a_row_reports_the_rate_and_the_nearest_rank_percentiles():
    latencies = list(np.random.default_rng(0).permutation(np.arange(1, 201) / 1000))  # 1 … 200 ms
    row = serve_load.Load(latencies, failed=3, seconds=4.0, mixed=1, snapshots={"a", "b"}).row("serve", 1000, "flat")
    assert row["qps"] == pytest.approx(50.0) and row["requests"] == 200
    assert row["p50_ms"] == pytest.approx(101.0) and row["p99_ms"] == pytest.approx(199.0)  # ranks 100 and 198 of 0…199
    assert (row["failed"], row["mixed"], row["snapshots"]) == (3, 1, 2)
    table = serve_load.table([row])
    assert table.splitlines()[2] == "| 1,000 | flat | - | serve | 50 | 101.00 | 199.00 | - | - | 200 | 3 | 1 | 2 |"
    batched = serve_load.Load(latencies, failed=0, seconds=4.0).row("router", 1000, "flat", per_call=16)
    assert batched["qps"] == pytest.approx(16 * 50.0)  # 16 queries per call


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


def rows_of_one_size(router_qps, served_qps, steady_p99, switching_p99, above_ms, failed=0, mixed=0):
    """The rows a run writes for one size, kind and server mode (the figures the targets read)."""
    def row(measure, qps, p99, server="-", **extra):
        return {"items": 100_000, "kind": "flat", "server": server, "measure": measure, "qps": qps, "p50_ms": 1.0,
                "p99_ms": p99, "requests": 10, "failed": 0, "mixed": 0, "snapshots": 1, **extra}

    name = "serve, 4 shard commits + deploy + rollback"
    return [row("index alone (ShardIndex.search, every shard)", 900, 2.0),
            row("router, one query per call", router_qps, 3.0, above_index_ms=above_ms),
            row("router, 16 queries per call", 2000, 9.0, above_index_ms=above_ms / 4),
            row("serve, 16 clients", served_qps, steady_p99, "pools"),
            row(name, served_qps, switching_p99, "pools"),
            row(f"{name}: requests in flight during a switch", served_qps, switching_p99, "pools", failed=failed,
                mixed=mixed, switches=6, served_switches=6)]


def test_the_verdicts_compare_each_figure_with_its_target():
    met = serve_load.verdicts(rows_of_one_size(500, 400, 50.0, 100.0, 0.3))  # 0.8x, 2.0x, 0.3 ms: on the bounds
    assert len(met) == 3 and all(line.endswith(": met") for line in met), met
    assert "served 400 q/s = 0.80x the router's 500" in met[1] and "2.00x steady" in met[2]
    missed = serve_load.verdicts(rows_of_one_size(500, 399, 50.0, 100.0, 0.31))
    assert [line.endswith("NOT met") for line in missed] == [True, True, False]
    for failed, mixed, p99 in ((1, 0, 50.0), (0, 1, 50.0), (0, 0, 100.1)):  # a failure, a mixed answer, a slow switch
        assert serve_load.verdicts(rows_of_one_size(500, 450, 50.0, p99, 0.1, failed, mixed))[2].endswith("NOT met")
    larger = [{**row, "items": 1_000_000} for row in rows_of_one_size(500, 450, 50.0, 60.0, 0.9)]
    assert serve_load.verdicts(larger)[0] == ("1,000,000 flat: router above the indexes 0.900 ms/query one per call, "
                                              "0.225 batched (the target is at 100,000 items)")  # reported, not judged
    fixed = {"items": 539, "kind": "flat", "server": "one process", "measure": "serve the run's own gallery, 16 clients",
             "qps": 299.5}
    assert serve_load.verdicts([fixed]) == ["539-item gallery one process: 300 requests/s (target >= 300): NOT met"]


def test_the_readme_section_is_rewritten_between_its_markers_only():
    rows = rows_of_one_size(500, 450, 50.0, 60.0, 0.2)
    section = serve_load.readme_section(rows, "Measured on two cores.")
    text = f"before\n{serve_load.BEGIN}\nold table\n{serve_load.END}\nafter\n"
    rewritten = replace_section(text, section, serve_load.BEGIN, serve_load.END)
    assert rewritten.startswith("before\n") and rewritten.endswith("\nafter\n") and "old table" not in rewritten
    assert serve_load.table(rows) in rewritten and "Measured on two cores." in rewritten


def test_the_plain_faiss_server_listens_where_the_system_says_and_answers_as_plain_search(tmp_path):
    import json
    import types
    import urllib.request

    import faiss

    from benchmarks.serve_baselines import PlainFaissServer, plain_search

    rng = np.random.default_rng(0)
    routes, indexes = [], []
    for shard, ids in enumerate((np.arange(0, 40), np.arange(40, 70))):
        index = faiss.IndexIDMap2(faiss.IndexFlatL2(8))
        index.add_with_ids(rng.normal(size=(len(ids), 8)).astype(np.float32), ids.astype(np.int64))
        routes.append(types.SimpleNamespace(shard=types.SimpleNamespace(index=shard), index=types.SimpleNamespace(index=index)))
        indexes.append(index)
    queries = rng.normal(size=(5, 8)).astype(np.float32)
    with PlainFaissServer(routes, tmp_path / "plain", k=4) as server:
        request = urllib.request.Request(f"{server.url}/search", data=json.dumps({"queries": queries.tolist()}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            found = np.asarray(json.loads(response.read())["ids"])
    assert found.tolist() == plain_search(indexes, queries, 4).tolist()
    assert set(found.ravel()) <= set(range(70)) and len(set(found[:, 0])) > 1  # both shards' ids, not one constant
