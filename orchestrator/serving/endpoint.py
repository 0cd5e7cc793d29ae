"""The HTTP API of one server replica, without Ray: a request (method, path, headers, body) in,
a status and a JSON document (or Prometheus text) out. ``serving.app`` puts it behind Ray Serve.

Routes:
- ``POST /search``: the body of ``serving.requests``; answered from one snapshot
  (``serving.snapshots``) by ``search.service.answer_document``, the function behind ``orchestrator
  search --json``, in this process or over the replica pools (``serving.pooled``): ``{"snapshot",
  "deployment", "serving", "gallery", "k", "paths", "searched_items", "not_searched",
  "results": [[{"id", "distance", "shard", "generation", "uri", metadata…}, …], …]}``;
- ``GET /status``: the served snapshot (deployment, serving generation, shards by generation),
  the backfills the lineage records as running, and a lineage state not served yet with the reason;
- ``GET /healthz``: ``{"ok": true, "snapshot"}`` (no token needed);
- ``GET /metrics``: Prometheus text: the snapshot and serving generation as labels of
  ``orchestrator_serve_snapshot_info``, the deployment id, snapshot swaps, responses by status.

With a token configured (``token_sha256``: the sha256 of the bearer token, so the secret itself is
never stored in the application's config), every route but ``/healthz`` needs
``Authorization: Bearer <token>`` (401 otherwise). Refusals are 4xx with ``{"error": one line}``;
an unexpected failure answering one request is a 500 with one line, and the replica keeps serving.

``handle`` answers a whole request. A server that reads bodies itself decides first what the
request line and headers decide (``admit``: route, method, token), reads the body only for an
admitted request (``serving.bodies``), then ``respond``s; ``refusal`` answers a ``BadRequest`` of
its own (counted in the metrics like every answer).
"""
from __future__ import annotations

import collections
import hashlib
import hmac
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.serving.requests import BadRequest, Limits, check_width, decode_queries, one_line, parse_search

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeSettings:
    """What every replica needs: the validated pipeline config (absolute storage), the bearer
    token's sha256 (None: no token), the URI prefixes image queries may name, the request limits,
    the lineage poll interval and the router's admission settings; whether replicas write leases,
    and the prefix of their names (``<lease_prefix>-<replica>``: one server's own, removed by
    ``orchestrator serve`` when it stops)."""

    config: Any  # orchestrator.config.PipelineConfig
    token_sha256: str | None = None
    read_prefixes: tuple[str, ...] = ()
    limits: Limits = Limits()
    poll_s: float = 1.0
    metric: str = "map"
    on_incompatible: str = "refuse"
    lease: bool = True
    lease_prefix: str = "serve"


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class GalleryEndpoint:
    """One replica's API over a ``SnapshotHolder`` that follows the pipeline's lineage.

    build_service: (``LineageState``, generation) → what answers a snapshot's requests (``.serving``,
    ``.width``, ``.encode(images)``, ``.answer(embeddings, k)``): by default a ``SearchService``
    built in this process (``serving.local``); the replica pools' ingress passes
    ``serving.pooled.PooledServices.build``, whose services call the encoder and shard-search replicas.
    """

    def __init__(self, settings: ServeSettings, holder_name: str,
                 build_service: Callable[[Any, str], Any] | None = None):
        from orchestrator.lineage import LineageStore
        from orchestrator.search.queries import decode_image
        from orchestrator.search.service import query_preprocessing
        from orchestrator.serving.local import LocalServices
        from orchestrator.serving.snapshots import SnapshotHolder, read_state
        from orchestrator.storage.leases import write_lease

        self.settings, self.holder_name = settings, holder_name
        config = settings.config
        self.gallery = config.gallery.name
        # a reader for as long as the server runs: it must see what runs commit meanwhile
        self.store = LineageStore(config.lineage, storage=config.storage, readonly=True, follows_writers=True)
        size, normalisation = query_preprocessing(config)
        self._decode = lambda data, where: decode_image(data, size, where, settings.limits.max_pixels)
        if build_service is None:
            build_service = LocalServices(settings, self.store, size, normalisation).build
        on_held = (lambda uris: write_lease(config.storage, holder_name, uris)) if settings.lease else None
        self.holder = SnapshotHolder(lambda: read_state(self.store, self.gallery), build_service, settings.poll_s,
                                     on_held)
        if on_held is not None:
            on_held(self.holder.held_uris())
        self.holder.start()
        self.responses: collections.Counter[int] = collections.Counter()
        self._routes: dict[tuple[str, str], Callable[[bytes], Any]] = {
            ("GET", "/healthz"): lambda _body: self._healthz(), ("GET", "/status"): lambda _body: self._status(),
            ("GET", "/metrics"): lambda _body: self._metrics(), ("POST", "/search"): self._search}

    def close(self) -> None:
        from orchestrator.storage.leases import drop_lease

        self.holder.stop()
        if self.settings.lease:
            drop_lease(self.settings.config.storage, self.holder_name)
        self.store.close()

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, Any]:
        """(HTTP status, a JSON-able dict or Prometheus text) of one request."""
        try:
            self.admit(method, path, headers)
        except BadRequest as refused:
            return self.refusal(refused)
        return self.respond(method, path, body)

    def admit(self, method: str, path: str, headers: Mapping[str, str]) -> None:
        """BadRequest unless the request line and headers alone let the request in: 404 no such
        route, 405 another method, 401 a missing or wrong token (every route but /healthz)."""
        if (method, path) not in self._routes:
            allowed = sorted(m for m, p in self._routes if p == path)
            raise BadRequest(405 if allowed else 404, f"{method} {path}: " + (
                f"use {' or '.join(allowed)}" if allowed else "no such route (POST /search, GET /status, /healthz, /metrics)"))
        if path != "/healthz":
            self._authorise(headers)

    def respond(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """(HTTP status, payload) of an admitted request."""
        try:
            status, payload = 200, self._routes[method, path](body)
        except BadRequest as refused:
            return self.refusal(refused)
        except Exception as error:  # one request failed; the replica keeps serving
            log.exception("request %s %s failed", method, path)
            status, payload = 500, {"error": one_line(f"{type(error).__name__}: {error}")}
        self.responses[status] += 1
        return status, payload

    def refusal(self, refused: BadRequest) -> tuple[int, dict[str, str]]:
        """(its 4xx status, ``{"error": reason}``) of a refused request, counted."""
        self.responses[refused.status] += 1
        return refused.status, {"error": refused.reason}

    def _authorise(self, headers: Mapping[str, str]) -> None:
        expected = self.settings.token_sha256
        if expected is None:
            return
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token_sha256(token.strip()), expected):
            raise BadRequest(401, "missing or wrong bearer token (Authorization: Bearer <token>)")

    def _healthz(self) -> dict[str, Any]:
        return {"ok": True, "snapshot": self.holder.current.id}

    def _status(self) -> dict[str, Any]:
        running = [{"shard": b.shard_index, "from": b.from_generation, "to": b.to_generation, "items": b.items}
                   for b in self.store.backfills(self.gallery) if b.status == "started"]
        return {"gallery": self.gallery, **self.holder.status(), "backfilling": running}

    def _metrics(self) -> str:
        status = self.holder.status()
        labels = f'replica="{self.holder_name}",gallery="{self.gallery}"'
        lines = ["# TYPE orchestrator_serve_snapshot_info gauge",
                 f'orchestrator_serve_snapshot_info{{{labels},snapshot="{status["snapshot"]}",'
                 f'serving="{status["serving"]}"}} 1',
                 "# TYPE orchestrator_serve_deployment_id gauge",
                 f"orchestrator_serve_deployment_id{{{labels}}} {status['deployment']}",
                 "# TYPE orchestrator_serve_items gauge", f"orchestrator_serve_items{{{labels}}} {status['items']}",
                 "# TYPE orchestrator_serve_snapshot_swaps_total counter",
                 f"orchestrator_serve_snapshot_swaps_total{{{labels}}} {status['swaps']}",
                 "# TYPE orchestrator_serve_responses_total counter"]
        lines += [f'orchestrator_serve_responses_total{{{labels},code="{code}"}} {count}'
                  for code, count in sorted(self.responses.items())]
        return "\n".join(lines) + "\n"

    def _search(self, body: bytes) -> dict[str, Any]:
        from orchestrator.storage import read_bytes

        request = parse_search(body, self.settings.limits)
        with self.holder.use() as snapshot:  # the one snapshot this request is answered from
            try:
                service = snapshot.service(request.generation)
            except ValueError as refused:  # unknown generation, or one that cannot search these shards
                raise BadRequest(400, str(refused)) from None
            if request.embeddings is not None:
                check_width(request.embeddings, service.width, service.serving)
                queries = request.embeddings
            else:
                queries = service.encode(decode_queries(request, read_bytes, self._decode,
                                                        self.settings.read_prefixes))
            answer = service.answer(queries, request.k)
            return {"snapshot": snapshot.id, "deployment": snapshot.state.deployment_id, "gallery": self.gallery,
                    "k": request.k, **answer}
