"""A server replica's API without Ray (``serving.endpoint``) on a copy of the served g0-old run:
it answers as ``orchestrator search`` does, follows a shard update a backfill commits, keeps the
replaced snapshot (and, through its lease, its files against ``gc``) while a request still uses it,
and refuses bad requests while it keeps serving. The replica pools' code (encoder, shard shares,
the ingress's merge) runs here in one process, called directly instead of through Serve's
handles: it answers as ``orchestrator search`` too."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from cli_runs import cli_in_process
from orchestrator.config import load_pipeline
from orchestrator.data import load_digits
from orchestrator.gallery import read_shard
from orchestrator.integrity import index_steps
from orchestrator.lineage import LineageStore
from orchestrator.serving.encoders import QueryEncoders
from orchestrator.serving.endpoint import GalleryEndpoint
from orchestrator.serving.pooled import PooledServices
from orchestrator.serving.settings import ServeSettings, token_sha256
from orchestrator.serving.shares import ShardShare
from orchestrator.shard_update import ShardTarget, write_shard_files
from orchestrator.storage import join_uri
from orchestrator.storage.leases import held_uris
from serving_client import png_files, search_body

pytestmark = pytest.mark.e2e


def commit_shard_without(store: LineageStore, storage: str, gallery: str, index: int, dropped: np.ndarray,
                         kind: str) -> None:
    """What a backfill commits for the items left in a shard: the shard's file and index rewritten
    without ``dropped`` under new names, the index hashed into the lineage, the row moved."""
    record = store.shards(gallery)[index]
    shard = read_shard(record.embeddings_uri, expected_sha256=record.sha256).without(dropped)
    written = write_shard_files(index, shard, ShardTarget(join_uri(storage, "galleries", gallery), kind), "test", True)
    store.assign_shard(gallery, index, shard.generation, written.embeddings_uri, written.index_uri, written.sha256,
                       len(shard), with_steps=index_steps([(written.index_uri, written.index_record)]))


@pytest.fixture
def endpoint(copy_g0_run, tmp_path):
    pipeline = copy_g0_run(tmp_path)
    config = load_pipeline(str(pipeline), {"storage": str(tmp_path / "run")})
    served = GalleryEndpoint(ServeSettings(config, token_sha256=token_sha256("s3cret"), poll_s=3600), "test-replica")
    yield served, config, pipeline
    served.close()


AUTH = {"authorization": "Bearer s3cret"}


def test_the_endpoint_answers_as_orchestrator_search_and_follows_a_committed_shard_update(endpoint, tmp_path):
    served, config, pipeline = endpoint
    queries = png_files(tmp_path, 3)
    cli = cli_in_process("search", str(pipeline), "--queries", *map(str, queries), "-k", "8", "--json", cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    expected = json.loads(cli.stdout)
    status, answer = served.handle("POST", "/search", AUTH, search_body(queries, k=8))
    assert status == 200 and answer["results"] == expected["results"] and answer["serving"] == "g0-old"
    assert answer["paths"] == expected["paths"] and answer["searched_items"] == expected["searched_items"] == 539
    first = answer["snapshot"]

    # the embeddings of those queries give the same hits (`orchestrator search --queries e.npy`)
    embeddings = served.holder.current.service().encode(load_digits("test").images[:3]).numpy()
    np.save(tmp_path / "e.npy", embeddings)
    cli = cli_in_process("search", str(pipeline), "--queries", str(tmp_path / "e.npy"), "-k", "8", "--json", cwd=tmp_path)
    status, answer = served.handle("POST", "/search", AUTH, json.dumps({"embeddings": embeddings.tolist(), "k": 8}).encode())
    assert status == 200 and answer["results"] == json.loads(cli.stdout)["results"] == expected["results"]

    store = LineageStore(config.lineage, storage=config.storage)
    gallery = config.gallery.name
    top = answer["results"][0][0]  # query 0's best hit, and its shard
    shard = top["shard"]
    files = lambda: {u for s in store.shards(gallery) if s.index == shard for u in (s.embeddings_uri, s.index_uri)}  # noqa: E731
    indexes = lambda: {r.shard.index: r.index for r in served.holder.current.service().router.routes}  # noqa: E731
    before = indexes()
    commit_shard_without(store, config.storage, gallery, shard, np.array([top["id"]]), config.gallery.index)
    assert served.holder.poll()  # the poll sees the commit and swaps
    after = indexes()  # the unchanged shards' indexes are reused, the rewritten one is loaded
    assert [after[i] is before[i] for i in sorted(before)] == [i != shard for i in sorted(before)]
    status, second = served.handle("POST", "/search", AUTH, search_body(queries, k=8))
    assert status == 200 and second["snapshot"] != first and second["searched_items"] == 538
    assert top["id"] not in {hit["id"] for hits in second["results"] for hit in hits}
    second_files = files()  # in no deployment's record: only a server's lease keeps them from gc
    other = int(next(i for i in read_shard(store.shards(gallery)[shard].embeddings_uri).ids if i != top["id"]))
    with served.holder.use() as in_flight:  # a request still answering from the second snapshot
        commit_shard_without(store, config.storage, gallery, shard, np.array([other]), config.gallery.index)
        assert served.holder.poll()
        status, third = served.handle("POST", "/search", AUTH, search_body(queries, k=8))
        assert in_flight.id == second["snapshot"] != third["snapshot"] and third["searched_items"] == 537
        assert second_files <= held_uris(config.storage)
        collected = cli_in_process("gc", str(pipeline), "--keep-deployments", "1", cwd=tmp_path)
        assert collected.returncode == 0, collected.stderr
        assert all(Path(uri).exists() for uri in second_files)
    served.holder.poll()  # the request ended: the lease no longer holds them, and gc removes them
    assert not second_files & held_uris(config.storage)
    collected = cli_in_process("gc", str(pipeline), "--keep-deployments", "1", cwd=tmp_path)
    assert collected.returncode == 0 and not any(Path(uri).exists() for uri in second_files)
    store.upsert_generation("g1", parent="g0-old")  # a next generation starts backfilling shard 2
    store.start_backfill(gallery, 2, "g1", 5)
    status, fourth = served.handle("GET", "/status", AUTH, b"")
    assert fourth["swaps"] == 2 and fourth["snapshot"] == third["snapshot"] and fourth["items"] == 537
    assert fourth["backfilling"] == [{"shard": 2, "from": "g0-old", "to": "g1", "items": 5}]
    store.close()


def test_bad_requests_get_a_4xx_with_one_line_and_the_endpoint_keeps_serving(endpoint, tmp_path):
    served, _config, _pipeline = endpoint
    good = search_body(png_files(tmp_path, 1), k=3)
    refusals = {
        "no token": ("POST", "/search", {}, good, 401),
        "wrong token": ("POST", "/search", {"authorization": "Bearer nope"}, good, 401),
        "wrong width": ("POST", "/search", AUTH, json.dumps({"embeddings": [[0.5] * 7]}).encode(), 400),
        "undecodable": ("POST", "/search", AUTH, json.dumps({"images": [base64.b64encode(b"no image").decode()]}).encode(), 400),
        "unknown generation": ("POST", "/search", AUTH, search_body(png_files(tmp_path, 1), generation="g9"), 400),
        "too many hits": ("POST", "/search", AUTH, search_body(png_files(tmp_path, 1), k=5000), 400),
        "oversized": ("POST", "/search", AUTH, b" " * (9 << 20), 413),
        "uri without prefixes": ("POST", "/search", AUTH, json.dumps({"uris": ["/etc/passwd"]}).encode(), 403),
        "wrong method": ("GET", "/search", AUTH, b"", 405),
        "no route": ("GET", "/admin", AUTH, b"", 404),
    }
    for name, (method, path, headers, body, code) in refusals.items():
        status, payload = served.handle(method, path, headers, body)
        assert status == code, (name, payload)
        assert set(payload) == {"error"} and "\n" not in payload["error"], name
    assert "embeds 33" in served.handle(*refusals["wrong width"][:4])[1]["error"]
    assert "'g9' is not in the lineage" in served.handle(*refusals["unknown generation"][:4])[1]["error"]
    assert served.handle("GET", "/healthz", {}, b"")[0] == 200  # no token needed
    status, answer = served.handle("POST", "/search", AUTH, good)
    assert status == 200 and len(answer["results"][0]) == 3
    metrics = served.handle("GET", "/metrics", AUTH, b"")[1]
    assert f'snapshot="{answer["snapshot"]}",serving="g0-old"}} 1' in metrics
    assert 'code="401"} 2' in metrics and 'code="200"} 2' in metrics  # /healthz and the search


class Done:
    """A call already answered (what a Serve ``DeploymentResponse`` gives on ``result()``)."""

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class InProcessCalls:
    """``serving.pooled``'s calls made directly on an encoder and shard shares of this process."""

    def __init__(self, encoders: QueryEncoders, shares: list[ShardShare]):
        self.encoders, self.share_objects, self.shares = encoders, shares, len(shares)
        self.prepared: list[tuple[int, str]] = []

    def plan(self, state, generation):
        return Done(self.encoders.plan(state, generation))

    def encode(self, model_key, images):
        return Done(self.encoders.encode(model_key, images))

    def prepare(self, share, key, admitted):
        self.prepared.append((share, key))
        return Done(self.share_objects[share].prepare(key, admitted))

    def search(self, share, key, queries, k, others=None):
        return Done(self.share_objects[share].search(key, queries, k, others))


def test_the_replica_pools_answer_as_orchestrator_search_and_reload_only_what_changed(copy_g0_run, tmp_path):
    pipeline = copy_g0_run(tmp_path)
    config = load_pipeline(str(pipeline), {"storage": str(tmp_path / "run")})
    settings = ServeSettings(config, poll_s=3600, lease=False)
    store = LineageStore(config.lineage, storage=config.storage)
    calls = InProcessCalls(QueryEncoders(settings), [ShardShare(store, share, 3) for share in range(3)])
    served = GalleryEndpoint(settings, "pooled", PooledServices(calls, config.gallery.name).build)
    try:
        queries = png_files(tmp_path, 3)
        cli = cli_in_process("search", str(pipeline), "--queries", *map(str, queries), "-k", "8", "--json", cwd=tmp_path)
        assert cli.returncode == 0, cli.stderr
        expected = json.loads(cli.stdout)
        status, answer = served.handle("POST", "/search", {}, search_body(queries, k=8))
        assert status == 200 and answer["results"] == expected["results"]
        assert (answer["paths"], answer["searched_items"]) == (expected["paths"], expected["searched_items"])
        shards = {r.index for r in store.shards(config.gallery.name) if r.n_items}
        assert {s for s, _key in calls.prepared} == {i % 3 for i in shards}  # each share got its own shards
        embeddings = calls.encoders.encode(served.holder.current.service().planned.model_key,
                                           load_digits("test").images[:3])
        status, by_embedding = served.handle("POST", "/search", {}, json.dumps({"embeddings": embeddings.tolist(),
                                                                               "k": 8}).encode())
        assert status == 200 and by_embedding["results"] == expected["results"]
        assert "embeds 33" in served.handle("POST", "/search", {}, json.dumps({"embeddings": [[0.5] * 7]}).encode())[1]["error"]

        top = answer["results"][0][0]
        loads = [share.indexes.loads for share in calls.share_objects]
        commit_shard_without(store, config.storage, config.gallery.name, top["shard"], np.array([top["id"]]),
                             config.gallery.index)
        assert served.holder.poll()
        changed = top["shard"] % 3  # one index reloaded, in the share holding the committed shard
        assert [share.indexes.loads - before for share, before in zip(calls.share_objects, loads)] == \
            [int(share == changed) for share in range(3)]
        assert calls.encoders.models.loads == 1  # the deployed generation's model, not reloaded by the swap
        status, second = served.handle("POST", "/search", {}, search_body(queries, k=8))
        assert status == 200 and second["snapshot"] != answer["snapshot"] and second["searched_items"] == 538
        assert top["id"] not in {hit["id"] for hits in second["results"] for hit in hits}

        calls.share_objects[changed]._held.clear()  # a share that lost the snapshot (a restarted replica)
        status, again = served.handle("POST", "/search", {}, search_body(queries, k=8))
        assert status == 200 and again == second  # prepared again and answered from the same snapshot
    finally:
        served.close()
        store.close()


def test_a_batch_of_requests_gets_what_each_request_gets_alone_in_one_process_and_over_the_pools(
        copy_g0_run, tmp_path):
    pipeline = copy_g0_run(tmp_path)
    config = load_pipeline(str(pipeline), {"storage": str(tmp_path / "run")})
    settings = ServeSettings(config, poll_s=3600, lease=False)
    store = LineageStore(config.lineage, storage=config.storage)
    calls = InProcessCalls(QueryEncoders(settings), [ShardShare(store, share, 2) for share in range(2)])
    local = GalleryEndpoint(settings, "local")
    pooled = GalleryEndpoint(settings, "pooled", PooledServices(calls, config.gallery.name).build)
    try:
        embeddings = local.holder.current.service().encode(load_digits("test").images[:6]).numpy()
        bodies = [json.dumps({"embeddings": [embeddings[0].tolist()], "k": 5}).encode(),
                  json.dumps({"embeddings": embeddings[1:4].tolist(), "k": 5}).encode(),  # three queries
                  b"{not json",
                  json.dumps({"embeddings": [[0.5] * 7]}).encode(),  # the wrong width
                  json.dumps({"embeddings": [embeddings[4].tolist()], "k": 9}).encode(),  # another k
                  json.dumps({"embeddings": [embeddings[5].tolist()], "generation": "g9"}).encode(),
                  search_body(png_files(tmp_path, 2), k=5)]  # images, searched with the embeddings
        for served in (local, pooled):
            batched = served.search_many(bodies)
            alone = [served.handle("POST", "/search", {}, body) for body in bodies]
            assert [status for status, _ in batched] == [200, 200, 400, 400, 200, 400, 200]
            assert batched == alone  # the same status and document, results included
            assert [len(payload["results"]) for status, payload in batched if status == 200] == [1, 3, 1, 2]
            assert [len(hits) for hits in batched[4][1]["results"]] == [9]
            assert len({payload["snapshot"] for status, payload in batched if status == 200}) == 1
        assert local.search_many(bodies) == pooled.search_many(bodies)  # both modes: the same answers
    finally:
        local.close()
        pooled.close()
        store.close()
