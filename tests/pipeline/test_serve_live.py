"""``orchestrator serve`` on Ray Serve, end to end (the serving issue's "done when").

The server runs on this test's local Ray over a copy of the served g0-old run, with its replica
pools: an ingress, an encoder replica and two shard-search replicas (each holding every other
shard), called through Serve's deployment handles. Its ``/search`` answers as ``orchestrator
search`` does; bad requests over real HTTP get a 4xx with one line and it
keeps serving. Then a client keeps querying while the pipeline, extended by g1, runs in another
process (g1 trains, its partial backfill commits shards, g1 deploys) and ``orchestrator deploy
--rollback`` serves g0-old again: no request fails, every response comes from one snapshot (the
snapshot of one deployment, whose shard map the lineage's deploy records hold, and its hits lie in
that map's shards with their generations), and the served generation follows the lineage.
"""
from __future__ import annotations

import base64
import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from cli_runs import cli, cli_in_process
from g0_run import REPO, g0_config, write_pipeline
from local_ray import start_local_ray
from orchestrator.config import load_pipeline
from orchestrator.lineage import LineageStore
from orchestrator.serving.settings import ServeSettings
from orchestrator.serving.snapshots import snapshot_id
from serving_client import free_port, png_files, search_body

pytestmark = pytest.mark.e2e


def call(url: str, method: str = "GET", body: bytes | None = None, timeout: float = 120) -> tuple[int, dict]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def declared_only(url: str, length: int) -> int:
    """The status of a ``POST /search`` that declares ``length`` bytes and sends only its headers."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.putrequest("POST", "/search")
        connection.putheader("Content-Length", str(length))
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.fixture
def server(copy_g0_run, tmp_path):
    import ray
    from ray import serve

    from orchestrator.serving.app import start_server
    from orchestrator.serving.settings import Pools

    pipeline = copy_g0_run(tmp_path)
    config = load_pipeline(str(pipeline), {"storage": str(tmp_path / "run")})
    start_local_ray()
    # g1 (one epoch) misses the compatibility criterion against g0-old (the run's gate is forced): the
    # server searches only the shards the serving generation is compatible with, as an operator asks
    # with --skip-incompatible, and so also serves the states a running backfill commits
    url = start_server(ServeSettings(config, poll_s=0.5, on_incompatible="skip"), port=free_port(),
                       pools=Pools(encoder_replicas=1, search_replicas=2, cpus=0.5))
    yield url, config, pipeline
    serve.shutdown()
    ray.shutdown()


def with_g1(tmp_path: Path) -> Path:
    """The g0-old pipeline extended by lifelong.yaml's g1 (one epoch, gate forced), on the same run."""
    config = g0_config()
    g1 = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())["generations"][1]
    g1["training"]["epochs"], g1["gate"] = 1, {"action": "force"}
    config["generations"].append(g1)
    return write_pipeline(tmp_path / "g01.yaml", config, tmp_path / "run")


def test_the_server_answers_as_search_and_follows_a_backfill_a_deployment_and_a_rollback(server, tmp_path):
    from ray import serve

    url, config, pipeline = server
    deployments = serve.status().applications["orchestrator"].deployments
    assert sorted(deployments) == ["encoder", "gallery", "shards-0-of-2", "shards-1-of-2"]
    queries = png_files(tmp_path, 2)
    cli_answer = cli_in_process("search", str(pipeline), "--queries", *map(str, queries), "-k", "5", "--json",
                                cwd=tmp_path)
    assert cli_answer.returncode == 0, cli_answer.stderr
    status, answer = call(f"{url}/search", "POST", search_body(queries, k=5))
    assert status == 200 and answer["results"] == json.loads(cli_answer.stdout)["results"]

    assert declared_only(url, 9 << 20) == 413  # refused from its Content-Length, before the body is sent
    bad = {"wrong width": (json.dumps({"embeddings": [[1.0] * 5]}).encode(), 400),
           "undecodable": (json.dumps({"images": [base64.b64encode(b"GIF89a?").decode()]}).encode(), 400),
           "unknown generation": (search_body(queries, generation="g7"), 400)}
    for name, (body, code) in bad.items():
        status, refused = call(f"{url}/search", "POST", body)
        assert status == code and "\n" not in refused["error"], (name, refused)
    assert call(f"{url}/healthz")[0] == 200

    responses: list[tuple[int, dict]] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            responses.append(call(f"{url}/search", "POST", search_body(queries, k=5)))

    thread = threading.Thread(target=client)
    thread.start()
    try:
        run = cli("run", str(with_g1(tmp_path)), cwd=tmp_path)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        wait_until(lambda: latest(responses).get("serving") == "g1", "g1 served")
        rollback = cli_in_process("deploy", str(pipeline), "--rollback", cwd=tmp_path)
        assert rollback.returncode == 0, rollback.stderr
        wait_until(lambda: latest(responses).get("deployment") == 3, "the rollback served")
    finally:
        stop.set()
        thread.join()

    assert [status for status, _ in responses if status != 200] == []  # no request failed
    store = LineageStore(config.lineage, storage=config.storage)
    deployments = store.deployments()
    assert [d.generation for d in deployments] == ["g0-old", "g1", "g0-old"]
    records = [store.committed_outputs(key)["shards"] for key in ("deploy:g0-old", "deploy:g1", "redeploy:g0-old:3")]
    recorded = {snapshot_id(d.id, d.generation, rows): {row["index"]: row["generation"] for row in rows if row["n_items"]}
                for d, rows in zip(deployments, records)}
    seen: dict[str, tuple[int, str, dict[int, str]]] = {}
    order = []
    for _status, answer in responses:  # every response from one snapshot: one deployment, one shard map
        deployment, serving, shard_map = seen.setdefault(answer["snapshot"], (answer["deployment"], answer["serving"], {}))
        assert (answer["deployment"], answer["serving"]) == (deployment, serving)
        for hit in (hit for hits in answer["results"] for hit in hits):
            assert shard_map.setdefault(hit["shard"], hit["generation"]) == hit["generation"]
            assert answer["snapshot"] not in recorded or recorded[answer["snapshot"]][hit["shard"]] == hit["generation"]
        if not order or order[-1] != answer["snapshot"]:
            order.append(answer["snapshot"])
    assert len(order) == len(set(order))  # snapshots follow each other, never back and forth
    assert set(recorded) <= set(order)  # each deployment was served with the shards it recorded
    assert [seen[s][0] for s in order] == sorted(seen[s][0] for s in order)  # deployments 1, 2, 3 in order
    assert {"g1"} == {g for s in order if seen[s][0] == 2 for g in seen[s][2].values()}  # g1 searches its own shards
    status, state = call(f"{url}/status")
    assert status == 200 and (state["serving"], state["deployment"], state["pending"]) == ("g0-old", 3, None)
    store.close()


def latest(responses: list[tuple[int, dict]]) -> dict:
    return responses[-1][1] if responses else {}


def wait_until(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
