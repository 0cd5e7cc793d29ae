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

``search_many(bodies)`` answers several ``POST /search`` bodies at once (the ingress batches
concurrent requests, ``serving.app``): each body is parsed and refused on its own, all are pinned
to one snapshot, and the queries of those that name the same generation and ``k`` are searched
as one (Q₁ + Q₂ + …, D) matrix by one ``answer`` call, whose per-query results are handed back
in order. A search's hits do not depend on the other queries searched with it (each query's top-k
is its own row), so every request gets the answer it gets alone.
"""
from __future__ import annotations

import collections
import hmac
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from orchestrator.serving.protocols import BuildService, SnapshotService
from orchestrator.serving.requests import BadRequest, SearchRequest, decode_queries, keyed_queries, one_line, parse_search
from orchestrator.serving.settings import ServeSettings, token_sha256

log = logging.getLogger(__name__)


class GalleryEndpoint:
    """One replica's API over a ``SnapshotHolder`` that follows the pipeline's lineage.

    build_service: (``LineageState``, generation) → the ``serving.protocols.SnapshotService`` that
    answers a snapshot's requests: by default a ``SearchService`` built in this process
    (``serving.local``); the replica pools' ingress passes ``serving.pooled.PooledServices.build``,
    whose services call the encoder and shard-search replicas.
    """

    def __init__(self, settings: ServeSettings, holder_name: str, build_service: BuildService | None = None):
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
        self._routes: dict[tuple[str, str], Callable[[], Any]] = {
            ("GET", "/healthz"): self._healthz, ("GET", "/status"): self._status, ("GET", "/metrics"): self._metrics}

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
        if (method, path) not in self._routes and (method, path) != SEARCH:
            allowed = sorted(m for m, p in [*self._routes, SEARCH] if p == path)
            raise BadRequest(405 if allowed else 404, f"{method} {path}: " + (
                f"use {' or '.join(allowed)}" if allowed else "no such route (POST /search, GET /status, /healthz, /metrics)"))
        if path != "/healthz":
            self._authorise(headers)

    def respond(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """(HTTP status, payload) of an admitted request."""
        if (method, path) == SEARCH:
            return self.search_many([body])[0]
        try:
            status, payload = 200, self._routes[method, path]()
        except Exception as error:  # one request failed; the replica keeps serving
            status, payload = _failure(f"{method} {path}", error)
        self.responses[status] += 1
        return status, payload

    def search_many(self, bodies: Sequence[bytes]) -> list[tuple[int, Any]]:
        """(HTTP status, payload) of each ``POST /search`` body, in order, all from one snapshot
        (module docstring), each counted."""
        answers: list[tuple[int, Any]] = [(0, None)] * len(bodies)
        with self.holder.use() as snapshot:  # the one snapshot these requests are answered from
            services: dict[str, SnapshotService] = {}  # by searching generation
            groups: dict[tuple[str, int], list[tuple[int, np.ndarray, dict[str, np.ndarray]]]] = {}  # by (generation, k)
            for number, body in enumerate(bodies):
                try:
                    request = parse_search(body, self.settings.limits)
                    service = self._service(snapshot, request.generation)
                    queries, others = self._queries(request, service)
                    services[service.serving] = service
                    groups.setdefault((service.serving, request.k), []).append((number, queries, others))
                except BadRequest as refused:
                    answers[number] = refused.status, {"error": refused.reason}
                except Exception as error:  # this request failed; the others are answered
                    answers[number] = _failure("POST /search", error)
            head = {"snapshot": snapshot.id, "deployment": snapshot.state.deployment_id, "gallery": self.gallery}
            for (generation, k), members in groups.items():
                try:
                    service = services[generation]
                    document = service.answer(np.concatenate([queries for _number, queries, _others in members]), k, {
                        name: np.concatenate([others[name] for _number, _queries, others in members])
                        for name in service.query_generations})
                except Exception as error:
                    failed = _failure("POST /search", error)
                    for number, _queries, _others in members:
                        answers[number] = failed
                    continue
                results, start = document.pop("results"), 0
                for number, queries, _others in members:
                    answers[number] = 200, {**head, "k": k, **document, "results": results[start:start + len(queries)]}
                    start += len(queries)
        self.responses.update(status for status, _payload in answers)
        return answers

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

    def _service(self, snapshot: Any, generation: str | None) -> SnapshotService:
        """The snapshot's service of ``generation`` (None: the deployed one); BadRequest 400 for an
        unknown generation, or one that cannot search these shards."""
        try:
            return snapshot.service(generation)
        except ValueError as refused:
            raise BadRequest(400, str(refused)) from None

    def _queries(self, request: SearchRequest, service: SnapshotService) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The (Q, D) float32 serving-generation queries of a request and the same queries by each
        generation a spherical interpolation path needs (``service.query_generations``): its
        embeddings (widths checked, ``keyed_queries``), or its images decoded and encoded by each."""
        from orchestrator.storage import read_bytes

        needed = service.query_generations
        if request.embeddings is not None or request.embeddings_by_generation is not None:
            return keyed_queries(request, service.serving, needed,
                                 lambda name: service.width if name == service.serving else service.width_of(name))
        images = decode_queries(request, read_bytes, self._decode, self.settings.read_prefixes)
        return (np.asarray(service.encode(images), dtype=np.float32),
                {name: np.asarray(service.encode(images, name), dtype=np.float32) for name in needed})


#: The route ``search_many`` answers.
SEARCH = ("POST", "/search")


def _failure(what: str, error: Exception) -> tuple[int, dict[str, str]]:
    """The 500 of a request that failed unexpectedly (logged with its traceback), in one line."""
    log.error("request %s failed", what, exc_info=error)
    return 500, {"error": one_line(f"{type(error).__name__}: {error}")}
