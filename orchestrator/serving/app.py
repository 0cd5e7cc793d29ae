"""``orchestrator serve`` on Ray Serve: the ingress ``GalleryServer`` (replicas, each a
``GalleryEndpoint`` with its own lineage follower and snapshots), answering HTTP itself (Ray
Serve's direct ingress) or behind Serve's HTTP proxy, and, unless ``search_replicas`` is 0, the
replica pools it calls through deployment handles:

- ``encoder`` (``QueryEncoder``, ``encoder_replicas`` replicas): the models, the route plan of a
  snapshot, the embedding of image queries (``serving.encoders``);
- ``shards-<i>-of-<n>`` (``ShardSearcher``, one deployment of one replica per share): the indexes
  of the shards ``i mod n`` (``serving.shares``);

the ingress parses and bounds requests, pins each to one snapshot, fans its search out and merges
(``serving.pooled``). With ``search_replicas`` 0 every ingress replica holds the whole snapshot
and searches in its own process (``serving.local``): the single-process mode.

Batching: concurrent ``POST /search`` requests of one ingress replica are answered together
(``serve.batch``): while one batch is searched, the requests that arrive queue, and the next batch
takes them all (at most ``ServeSettings.max_batch``, waiting ``batch_wait_s`` for more; up to
``concurrent_batches`` batches searched at once), parses
each, pins all to one snapshot and searches their queries as one matrix
(``GalleryEndpoint.search_many``): one routed search, one call to each shard share, per batch, not
per request. The answers are encoded by orjson (ASCII unless a value needs more; then the
standard library's ASCII-escaping encoder).

``start_server`` starts Serve on the Ray this process is connected to, its HTTP on ``host:port``
(127.0.0.1 unless told otherwise: the proxy's, or with direct ingress the first ingress
replica's), and deploys the application ``APP_NAME`` at ``/``; it returns when every replica has
loaded its first snapshot. ``stop_server`` undoes it within a bounded time.

Slow and hostile clients (``serving.bodies``): the ingress decides route, method, bearer token and
declared length from the headers before it reads a body (401/404/405/413 at once), then reads the
body with a deadline (408) and a byte bound (413). A request reaches the replica as soon as its
headers arrived (from its own HTTP server, or from the proxy, which it then pulls the body from),
so a request whose body is slow occupies one of the replica's ``max_ongoing_requests`` while it
waits: the ingress takes ``INGRESS_MAX_ONGOING`` at once (waiting coroutines, cheap), not the 16
searches a replica runs, so hundreds of half-open connections leave room for every other request.
The search itself runs in a thread of the replica, so ``/healthz`` and ``/status`` answer while a
search runs. Every answer is one JSON document (ASCII, whatever the request quoted), an error one
line.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import shlex
import socket
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import orjson
import ray
from ray import serve
from ray.exceptions import RayTaskError
from ray.serve import Application
from ray.serve.handle import DeploymentHandle
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response

from orchestrator.distributed.task_errors import raised_error
from orchestrator.gc_startup import startup_phase
from orchestrator.serving.bodies import declared_length, read_body
from orchestrator.serving.endpoint import SEARCH, GalleryEndpoint
from orchestrator.serving.requests import BadRequest, one_line
from orchestrator.serving.settings import (
    Pools,
    ServeSettings,
    parse_serve_arguments,
    pools_of,
    serve_settings,
)

if TYPE_CHECKING:
    from orchestrator.comparison import ComparisonPath
    from orchestrator.lineage.records import ShardRecord
    from orchestrator.search.attributes import ItemColumns
    from orchestrator.search.router import ShardHits
    from orchestrator.serving.encoders import EncoderPlan
    from orchestrator.serving.model_cache import ModelKey
    from orchestrator.serving.pooled import Pending
    from orchestrator.serving.snapshots import LineageState

T = TypeVar("T")

APP_NAME = "orchestrator"
#: Requests one ingress replica takes at once, most of them possibly waiting for their bodies
#: (module docstring); the searches themselves run in the replica's worker threads.
INGRESS_MAX_ONGOING = 1024
#: Seconds a replica being deleted gets to finish its requests (searches take milliseconds), and
#: how often it looks whether they have.
GRACEFUL_SHUTDOWN_S, GRACEFUL_SHUTDOWN_POLL_S = 3.0, 0.5
#: Seconds ``stop_server`` waits for Serve to delete the application before it stops Ray anyway.
DELETE_TIMEOUT_S = 10.0


@serve.deployment(name="encoder", max_ongoing_requests=16)
class QueryEncoder:
    """An encoder replica: ``serving.encoders.QueryEncoders`` behind a deployment handle."""

    def __init__(self, settings: ServeSettings):
        with startup_phase():  # the encoders' imports and models (gc_startup)
            from orchestrator.serving.encoders import QueryEncoders

            self.encoders = QueryEncoders(settings)

    def plan(self, state: LineageState, generation: str) -> EncoderPlan:
        return self.encoders.plan(state, generation)

    def encode(self, model_key: ModelKey, images: np.ndarray) -> np.ndarray:
        return self.encoders.encode(model_key, images)


@serve.deployment(max_ongoing_requests=16)
class ShardSearcher:
    """A shard-search replica: share ``share`` of ``shares`` (``serving.shares.ShardShare``)."""

    def __init__(self, settings: ServeSettings, share: int, shares: int):
        with startup_phase():  # the index layer and the lineage's reader (gc_startup)
            from orchestrator.lineage import LineageStore
            from orchestrator.serving.shares import ShardShare

            config = settings.config
            store = LineageStore(config.lineage, storage=config.storage, readonly=True, follows_writers=True)
            self.share = ShardShare(store, share, shares)

    def prepare(self, key: str, admitted: Sequence[tuple[ShardRecord, ComparisonPath]]) -> list[tuple[int, str]]:
        return self.share.prepare(key, admitted)

    def search(self, key: str, queries: np.ndarray, k: int, others: dict[str, np.ndarray] | None = None
               ) -> tuple[ShardHits, dict[int, ItemColumns]] | None:
        return self.share.search(key, queries, k, others)


class Reply(Generic[T]):
    """A deployment handle's response whose ``result()`` raises what the called replica raised (a
    ``ValueError`` naming an unknown generation, say), not Ray's wrapper of it, whose message is
    the remote traceback in terminal colours."""

    def __init__(self, response: Pending[T]):
        self.response = response

    def result(self) -> T:
        try:
            return self.response.result()
        except RayTaskError as failed:
            cause = raised_error(failed)
            if cause is failed or not isinstance(cause, Exception):
                raise
            raise cause from None


class HandleCalls:
    """The calls of ``serving.pooled`` (``PoolCalls``) over the pools' deployment handles (each a
    ``Reply``, whose ``result()`` the ingress waits on in a worker thread)."""

    def __init__(self, encoder: DeploymentHandle, shares: list[DeploymentHandle]):
        self.encoder, self.share_handles, self.shares = encoder, shares, len(shares)

    def plan(self, state: LineageState, generation: str) -> Reply[EncoderPlan]:
        return Reply(self.encoder.plan.remote(state, generation))

    def encode(self, model_key: ModelKey, images: np.ndarray) -> Reply[np.ndarray]:
        return Reply(self.encoder.encode.remote(model_key, images))

    def prepare(self, share: int, key: str, admitted: Sequence[tuple[ShardRecord, ComparisonPath]]
                ) -> Reply[list[tuple[int, str]]]:
        return Reply(self.share_handles[share].prepare.remote(key, admitted))

    def search(self, share: int, key: str, queries: np.ndarray, k: int, others: dict[str, np.ndarray]
               ) -> Reply[tuple[ShardHits, dict[int, ItemColumns]] | None]:
        return Reply(self.share_handles[share].search.remote(key, queries, k, others))


@serve.deployment(name="gallery", max_ongoing_requests=INGRESS_MAX_ONGOING,
                  graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S, graceful_shutdown_wait_loop_s=GRACEFUL_SHUTDOWN_POLL_S)
class GalleryServer:
    """The ingress: a ``GalleryEndpoint`` named after the replica (its lease file), searching in
    its own process or, given the pools' handles, over them."""

    def __init__(self, settings: ServeSettings, encoder: DeploymentHandle | None = None,
                 shares: list[DeploymentHandle] | None = None):
        replica = serve.get_replica_context().replica_id.unique_id
        build = None
        if encoder is not None:
            from orchestrator.serving.pooled import PooledServices

            build = PooledServices(HandleCalls(encoder, list(shares or [])), settings.config.gallery.name).build
        # the first snapshot is built through the handles' blocking result(): not on the event loop;
        # a start-up phase (gc_startup): the models, indexes and lineage it loads are frozen with it
        with startup_phase(), concurrent.futures.ThreadPoolExecutor(1) as starting:
            self.endpoint = starting.submit(GalleryEndpoint, settings, f"{settings.lease_prefix}-{replica}",
                                            build).result()
        self.limits = settings.limits
        self.search_batch = serve.batch(max_batch_size=settings.max_batch, batch_wait_timeout_s=settings.batch_wait_s,
                                        max_concurrent_batches=settings.concurrent_batches)(self._search_bodies)

    async def __call__(self, request: Request) -> Response:
        method, path = request.method, request.url.path
        try:  # what the headers decide, before any of the body is read
            self.endpoint.admit(method, path, request.headers)
            declared_length(request.headers.get("content-length"), self.limits.max_body_bytes)
            body = b""
            if method == "POST":
                body = await read_body(request.stream(), self.limits.max_body_bytes, self.limits.body_timeout_s)
        except BadRequest as refused:
            return json_response(*self.endpoint.refusal(refused))
        except ClientDisconnect:  # nobody is left to answer
            return Response(status_code=499)
        if (method, path) == SEARCH:
            status, encoded = await self.search_batch(body)
            return Response(encoded, status, media_type="application/json")
        status, payload = await asyncio.to_thread(self.endpoint.respond, method, path, body)
        if isinstance(payload, str):
            return PlainTextResponse(payload, status, media_type="text/plain; version=0.0.4")
        return json_response(status, payload)

    async def _search_bodies(self, bodies: list[bytes]) -> list[tuple[int, bytes]]:
        """(status, encoded JSON) of each of the queued ``POST /search`` bodies, answered together
        in a worker thread (module docstring); ``search_batch``, its ``serve.batch`` of this
        replica's settings, takes one body a call."""
        return await asyncio.to_thread(self._answer_batch, bodies)

    def _answer_batch(self, bodies: list[bytes]) -> list[tuple[int, bytes]]:
        answers = []
        for status, payload in self.endpoint.search_many(bodies):
            try:
                answers.append((status, encode_json(payload)))
            except (TypeError, ValueError) as error:  # a metadata value JSON cannot hold: this answer alone fails
                answers.append((500, encode_json({"error": one_line(f"answer not encodable as JSON: {error}")})))
        return answers

    def __del__(self) -> None:  # Serve calls it when the replica shuts down
        endpoint = getattr(self, "endpoint", None)
        if endpoint is not None:
            endpoint.close()


def json_response(status: int, payload: Any) -> Response:
    """``payload`` as one line of JSON (``encode_json``)."""
    return Response(encode_json(payload), status, media_type="application/json")


def encode_json(payload: Any) -> bytes:
    """``payload`` as one line of JSON in ASCII: by orjson (fast) when its UTF-8 is ASCII, else by
    the standard library with every other character escaped (a value with non-ASCII characters,
    or a reason quoting a lone surrogate the client sent, which orjson refuses)."""
    try:
        encoded = orjson.dumps(payload)
    except TypeError:  # a lone surrogate
        encoded = b""
    if encoded and encoded.isascii():
        return encoded
    return json.dumps(payload, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def app_builder(args: dict[str, str]) -> Application:
    """The application of ``orchestrator serve``'s arguments, for Serve config files (a KubeRay
    RayService's ``serveConfigV2``): ``import_path: orchestrator.serving.app:app_builder`` with
    ``args: {command: "FILE --storage … --token-env NAME"}``, the options of ``orchestrator serve``
    (``--host``/``--port`` are the config's ``http_options`` there; ``--ray-address`` is unused)."""
    parsed = parse_serve_arguments(shlex.split(args["command"]))
    return application(serve_settings(parsed), pools_of(parsed))


def application(settings: ServeSettings, pools: Pools = Pools()) -> Application:
    """The application's deployment graph (module docstring); Serve's access log line per request
    in every deployment only where ``settings.access_log``."""
    logging = {"enable_access_log": settings.access_log}
    if pools.search_replicas == 0:
        options = GalleryServer.options(num_replicas=pools.replicas, ray_actor_options={"num_cpus": pools.cpus},
                                        logging_config=logging)
        return options.bind(settings)
    resources = {"num_cpus": pools.cpus}
    encoder = QueryEncoder.options(num_replicas=pools.encoder_replicas, ray_actor_options=resources,
                                   logging_config=logging).bind(settings)
    n = pools.search_replicas
    shares = [ShardSearcher.options(name=f"shards-{i}-of-{n}", num_replicas=1, ray_actor_options=resources,
                                    logging_config=logging).bind(settings, i, n) for i in range(n)]
    ingress = GalleryServer.options(num_replicas=pools.replicas, ray_actor_options={"num_cpus": 0},
                                    logging_config=logging)
    return ingress.bind(settings, encoder, shares)


def start_server(settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000, pools: Pools = Pools(),
                 direct_ports: range | None = None) -> str:
    """Deploy the application on the connected Ray; returns its base URL once it serves.

    ``direct_ports``: None where Serve's proxy answers HTTP (on ``port``); else the ports the
    ingress replicas answer on themselves (Ray started in direct ingress,
    ``settings.direct_ingress_ports``): the first replica on the first port (``port``, as the
    serve command sets them), each next replica on the next; the proxy, which Serve still starts,
    then listens on a free port of ``host`` that no client is told."""
    proxy_port = port if direct_ports is None else _free_port(host)
    serve.start(http_options={"host": host, "port": proxy_port})
    serve.run(application(settings, pools), name=APP_NAME, route_prefix="/")
    return f"http://{host}:{port if direct_ports is None else direct_ports.start}"


def _free_port(host: str) -> int:
    """A TCP port of ``host`` that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def stop_server(settings: ServeSettings, delete_timeout_s: float = DELETE_TIMEOUT_S) -> str:
    """Delete the application (its replicas finish their requests and drop their leases) for at
    most ``delete_timeout_s`` seconds, or until Ray's GCS is gone (a signal to the whole process
    group stops a local Ray's own processes too), disconnect from Ray (which stops a local Ray this
    process started, its workers with it), then remove whatever lease of this server's replicas is
    left (a replica killed before it could). Returns how long each step took, in words."""
    from orchestrator.storage.leases import drop_leases

    start = time.monotonic()
    gcs = ray.get_runtime_context().gcs_address
    deleting = threading.Thread(target=serve.delete, args=(APP_NAME,), daemon=True)
    deleting.start()
    deleted = _joined_while_reachable(deleting, gcs, delete_timeout_s)
    deleting_s = time.monotonic() - start
    ray.shutdown()
    left = drop_leases(settings.config.storage, f"{settings.lease_prefix}-")
    return (f"application {'deleted' if deleted else 'not deleted (Ray gone or too slow)'} in {deleting_s:.1f} s, "
            f"Ray disconnected in {time.monotonic() - start - deleting_s:.1f} s, {len(left)} lease(s) left to remove")


def _joined_while_reachable(thread: threading.Thread, address: str, timeout_s: float) -> bool:
    """Whether ``thread`` ended within ``timeout_s`` seconds, giving up as soon as nothing accepts
    connections at ``address`` (host:port) any more."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        thread.join(0.25)
        if not thread.is_alive():
            return True
        try:
            socket.create_connection((host, int(port)), timeout=0.25).close()
        except OSError:
            return False
    return False
