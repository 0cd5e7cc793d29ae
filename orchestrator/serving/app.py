"""``orchestrator serve`` on Ray Serve: replicas of ``GalleryServer``, each a ``GalleryEndpoint``
(its own lineage follower and snapshots), behind Serve's HTTP proxy.

``start_server`` starts Serve's proxy on ``host:port`` (127.0.0.1 unless told otherwise) on the Ray
this process is connected to and deploys the application ``APP_NAME`` at ``/``; it returns when
every replica has loaded its first snapshot. A request's body is refused (413) from its
Content-Length when it is larger than the limit, and dropped as it arrives, never held. The search itself runs in a
thread of the replica, so ``/healthz`` and ``/status`` answer while a search runs.
"""
from __future__ import annotations

import asyncio
import shlex
import time

from ray import serve
from ray.serve import Application
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from orchestrator.serving.endpoint import GalleryEndpoint, ServeSettings

APP_NAME = "orchestrator"
#: A refused body is read (and dropped) up to this many times the limit before the answer.
DISCARD_FACTOR = 4


@serve.deployment(name="gallery", max_ongoing_requests=16)
class GalleryServer:
    """One replica: a ``GalleryEndpoint`` named after the replica (its lease file)."""

    def __init__(self, settings: ServeSettings):
        replica = serve.get_replica_context().replica_id.unique_id
        self.endpoint = GalleryEndpoint(settings, f"serve-{replica}")
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
    from orchestrator.serving.cli import parse_serve_arguments, serve_settings

    parsed = parse_serve_arguments(shlex.split(args["command"]))
    return application(serve_settings(parsed), parsed.replicas)


def application(settings: ServeSettings, replicas: int = 1, cpus_per_replica: float = 1.0) -> Application:
    options = GalleryServer.options(num_replicas=replicas, ray_actor_options={"num_cpus": cpus_per_replica})
    return options.bind(settings)


def start_server(settings: ServeSettings, host: str = "127.0.0.1", port: int = 8000, replicas: int = 1,
                 cpus_per_replica: float = 1.0) -> str:
    """Deploy the application on the connected Ray; returns its base URL once it serves."""
    serve.start(http_options={"host": host, "port": port})
    serve.run(application(settings, replicas, cpus_per_replica), name=APP_NAME, route_prefix="/")
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
