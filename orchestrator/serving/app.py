"""``orchestrator serve`` on Ray Serve: the ingress ``GalleryServer`` (replicas, each a
``GalleryEndpoint`` with its own lineage follower and snapshots) behind Serve's HTTP proxy, and,
unless ``search_replicas`` is 0, the replica pools it calls through deployment handles:

- ``encoder`` (``QueryEncoder``, ``encoder_replicas`` replicas): the models, the route plan of a
  snapshot, the embedding of image queries (``serving.encoders``);
- ``shards-<i>-of-<n>`` (``ShardSearcher``, one deployment of one replica per share): the indexes
  of the shards ``i mod n`` (``serving.shares``);

the ingress parses and bounds requests, pins each to one snapshot, fans its search out and merges
(``serving.pooled``). With ``search_replicas`` 0 every ingress replica holds the whole snapshot
and searches in its own process (``serving.local``): the single-process mode.

``start_server`` starts Serve's proxy on ``host:port`` (127.0.0.1 unless told otherwise) on the Ray
this process is connected to and deploys the application ``APP_NAME`` at ``/``; it returns when
every replica has loaded its first snapshot. A request's body is refused (413) from its
Content-Length when it is larger than the limit, and dropped as it arrives, never held. The search itself runs in a
thread of the replica, so ``/healthz`` and ``/status`` answer while a search runs.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import shlex
import time
from dataclasses import dataclass

from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from orchestrator.serving.endpoint import GalleryEndpoint, ServeSettings

APP_NAME = "orchestrator"
#: A refused body is read (and dropped) up to this many times the limit before the answer.
DISCARD_FACTOR = 4


@serve.deployment(name="encoder", max_ongoing_requests=16)
class QueryEncoder:
    """An encoder replica: ``serving.encoders.QueryEncoders`` behind a deployment handle."""

    def __init__(self, settings: ServeSettings):
        from orchestrator.serving.encoders import QueryEncoders

        self.encoders = QueryEncoders(settings)

    def plan(self, state, generation: str):
        return self.encoders.plan(state, generation)

    def encode(self, model_key, images):
        return self.encoders.encode(model_key, images)


@serve.deployment(max_ongoing_requests=16)
class ShardSearcher:
    """A shard-search replica: share ``share`` of ``shares`` (``serving.shares.ShardShare``)."""

    def __init__(self, settings: ServeSettings, share: int, shares: int):
        from orchestrator.lineage import LineageStore
        from orchestrator.serving.shares import ShardShare

        config = settings.config
        store = LineageStore(config.lineage, storage=config.storage, readonly=True, follows_writers=True)
        self.share = ShardShare(store, share, shares)

    def prepare(self, key: str, admitted):
        return self.share.prepare(key, admitted)

    def search(self, key: str, queries, k: int):
        return self.share.search(key, queries, k)


class HandleCalls:
    """The calls of ``serving.pooled`` over the pools' deployment handles (each ``.remote()`` is a
    ``DeploymentResponse``, whose ``result()`` the ingress waits on in a worker thread)."""

    def __init__(self, encoder: DeploymentHandle, shares: list[DeploymentHandle]):
        self.encoder, self.share_handles, self.shares = encoder, shares, len(shares)

    def plan(self, state, generation: str):
        return self.encoder.plan.remote(state, generation)

    def encode(self, model_key, images):
        return self.encoder.encode.remote(model_key, images)

    def prepare(self, share: int, key: str, admitted):
        return self.share_handles[share].prepare.remote(key, admitted)

    def search(self, share: int, key: str, queries, k: int):
        return self.share_handles[share].search.remote(key, queries, k)


@serve.deployment(name="gallery", max_ongoing_requests=16)
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
        # the first snapshot is built through the handles' blocking result(): not on the event loop
        with concurrent.futures.ThreadPoolExecutor(1) as starting:
            self.endpoint = starting.submit(GalleryEndpoint, settings, f"serve-{replica}", build).result()
        self.max_body = settings.limits.max_body_bytes

    async def __call__(self, request: Request) -> Response:
        declared = request.headers.get("content-length", "0")
        if not declared.isdigit() or int(declared) > self.max_body:
            await self._discard(request)
            return JSONResponse({"error": f"Content-Length {declared!r}: at most {self.max_body} bytes"}, 413)
        body = await request.body() if request.method == "POST" else b""
        status, payload = await asyncio.to_thread(self.endpoint.handle, request.method, request.url.path,
                                                  request.headers, body)
        if isinstance(payload, str):
            return PlainTextResponse(payload, status, media_type="text/plain; version=0.0.4")
        return JSONResponse(payload, status)

    async def _discard(self, request: Request) -> None:
        """Read and drop a refused body, up to DISCARD_FACTOR times the limit, so that the client
        (still sending) gets the 413 instead of a reset connection; a larger one is cut off."""
        seen = 0
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > DISCARD_FACTOR * self.max_body:
                break

    def __del__(self) -> None:  # Serve calls it when the replica shuts down
        endpoint = getattr(self, "endpoint", None)
        if endpoint is not None:
            endpoint.close()


def app_builder(args: dict[str, str]) -> Application:
    """The application of ``orchestrator serve``'s arguments, for Serve config files (a KubeRay
    RayService's ``serveConfigV2``): ``import_path: orchestrator.serving.app:app_builder`` with
    ``args: {command: "FILE --storage … --token-env NAME"}``, the options of ``orchestrator serve``
    (``--host``/``--port`` are the config's ``http_options`` there; ``--ray-address`` is unused)."""
    from orchestrator.serving.cli import parse_serve_arguments, pools_of, serve_settings

    parsed = parse_serve_arguments(shlex.split(args["command"]))
    return application(serve_settings(parsed), pools_of(parsed))


@dataclass(frozen=True)
class Pools:
    """How many replicas of each deployment: ``replicas`` ingress replicas; ``search_replicas``
    shard-search replicas (0: the single-process mode, module docstring) and ``encoder_replicas``
    encoder replicas; ``cpus``: the CPUs Ray reserves for each replica that embeds or searches (the
    ingress of the pools only parses and merges, and reserves none)."""

    replicas: int = 1
    encoder_replicas: int = 1
    search_replicas: int = 1
    cpus: float = 1.0


def application(settings: ServeSettings, pools: Pools = Pools()) -> Application:
    """The application's deployment graph (module docstring)."""
    if pools.search_replicas == 0:
        options = GalleryServer.options(num_replicas=pools.replicas, ray_actor_options={"num_cpus": pools.cpus})
        return options.bind(settings)
    resources = {"num_cpus": pools.cpus}
    encoder = QueryEncoder.options(num_replicas=pools.encoder_replicas, ray_actor_options=resources).bind(settings)
    n = pools.search_replicas
    shares = [ShardSearcher.options(name=f"shards-{i}-of-{n}", num_replicas=1, ray_actor_options=resources)
              .bind(settings, i, n) for i in range(n)]
    ingress = GalleryServer.options(num_replicas=pools.replicas, ray_actor_options={"num_cpus": 0})
    return ingress.bind(settings, encoder, shares)


def start_server(settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000, pools: Pools = Pools()) -> str:
    """Deploy the application on the connected Ray; returns its base URL once it serves."""
    serve.start(http_options={"host": host, "port": port})
    serve.run(application(settings, pools), name=APP_NAME, route_prefix="/")
    return f"http://{host}:{port}"


def serve_until_interrupted(poll_s: float = 1.0) -> None:
    """Block until Ctrl-C / SIGTERM, then delete the application (its replicas drop their leases)."""
    try:
        while True:
            time.sleep(poll_s)
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(APP_NAME)
