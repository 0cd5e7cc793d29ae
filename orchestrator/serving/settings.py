"""What ``orchestrator serve`` is told: its options, and the settings and pools they make.

``add_serve_options`` adds the command's options to a parser; ``parse_serve_arguments`` parses
them alone (a Serve config file's ``args``, ``serving.app.app_builder``); ``serve_settings`` and
``pools_of`` turn parsed options into the ``ServeSettings`` every replica is built with and the
``Pools`` of the deployment graph. The command (``serving.cli``) and the application
(``serving.app``) both read this module and not each other. It imports neither Ray nor torch:
a usage error is answered before either loads.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.cli_options import add_pipeline_options, int_at_least, pipeline_overrides
from orchestrator.errors import UsageError
from orchestrator.metrics.names import METRICS


@dataclass(frozen=True)
class Limits:
    """Bounds of one request: body bytes, queries per request, hits per query, pixels per image,
    seconds its body may take to arrive (``serving.bodies``)."""

    max_body_bytes: int = 8 << 20
    max_queries: int = 256
    max_k: int = 1000
    max_pixels: int = 4096 * 4096
    body_timeout_s: float = 10.0


#: Requests the ingress answers with one routed search at most (``--max-batch``), and the seconds a
#: batch waits after its first request for more (``--batch-wait``). With no wait a batch took only
#: the requests queued when the last one finished, a few under load: at 10⁵ flat items, 16 clients,
#: one process on 2 cores, 329-343 queries/s with no wait, 503 with 1 ms, 746 with 3 ms, 722 with
#: 5 ms (benchmarks/README.md, serve_load ``--batch-wait``); a lone request waits the 3 ms.
DEFAULT_MAX_BATCH, DEFAULT_BATCH_WAIT_S = 32, 0.003
#: Batches an ingress replica searches at once (``--concurrent-batches``): the next batch forms and
#: is parsed, searched or encoded while the last one is elsewhere in the pipeline (a worker thread, a
#: shard share). At 10⁵ flat items, 16 clients, 2 cores (serve_load, one run each): one at a time,
#: 820 queries/s in one process and 464 through the pools; two, 902 and 820; four, 907 and 647.
DEFAULT_CONCURRENT_BATCHES = 2


@dataclass(frozen=True)
class ServeSettings:
    """What every replica needs: the validated pipeline config (absolute storage), the bearer
    token's sha256 (None: no token), the URI prefixes image queries may name, the request limits,
    the lineage poll interval and the router's admission settings; whether replicas write leases,
    and the prefix of their names (``<lease_prefix>-<replica>``: one server's own, removed by
    ``orchestrator serve`` when it stops); how the ingress batches concurrent searches: at most
    ``max_batch`` requests in one routed search, waiting at most ``batch_wait_s`` seconds after the
    first for more (0: take only what is queued when the last batch finished), ``concurrent_batches``
    batches at once (the next batch forms while the last is searched); whether Serve writes
    its access log line for each request to its replicas' log files (``access_log``: off by
    default, the requests/s it costs in benchmarks/README.md, serve_load)."""

    config: Any  # orchestrator.config.PipelineConfig
    token_sha256: str | None = None
    read_prefixes: tuple[str, ...] = ()
    limits: Limits = Limits()
    poll_s: float = 1.0
    metric: str = "map"
    on_incompatible: Literal["refuse", "skip"] = "refuse"
    lease: bool = True
    lease_prefix: str = "serve"
    max_batch: int = DEFAULT_MAX_BATCH
    batch_wait_s: float = DEFAULT_BATCH_WAIT_S
    concurrent_batches: int = DEFAULT_CONCURRENT_BATCHES
    access_log: bool = False


@dataclass(frozen=True)
class Pools:
    """How many replicas of each deployment: ``replicas`` ingress replicas; ``search_replicas``
    shard-search replicas (0: the single-process mode, ``serving.app``) and ``encoder_replicas``
    encoder replicas; ``cpus``: the CPUs Ray reserves for each replica that embeds or searches (the
    ingress of the pools only parses and merges, and reserves none)."""

    replicas: int = 1
    encoder_replicas: int = 1
    search_replicas: int = 0
    cpus: float = 1.0


#: Ray Serve's throughput mode (Ray >= 2.56: gRPC between Serve's processes, buffered request
#: logs) with direct ingress: each ingress replica answers HTTP itself on a port of its own
#: (``DIRECT_INGRESS_PORTS``), with no hop through Serve's proxy; nothing in front of a local server
#: needs time to deregister a replica that stops (no draining period) or to forget its port (no
#: quarantine: a replica that restarts takes its port again); the handles' router in its own
#: loop (the pools' ingress calls the shares' handles from worker threads). On the 539-item default
#: gallery, 2 cores: benchmarks/README.md, serve_load.
SERVE_THROUGHPUT_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
                        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0", "RAY_SERVE_PORT_QUARANTINE_S": "0",
                        "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1"}
#: The variables bounding the ports direct-ingress replicas listen on: ``range(MIN, MAX)``.
DIRECT_INGRESS_PORTS = ("RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT", "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT")


def local_ray_serve_env(address: str | None, environ: dict[str, str], port: int, replicas: int) -> dict[str, str]:
    """The variables ``serve`` sets before it starts a local Ray (``address`` None or "local" and
    no RAY_ADDRESS): the throughput mode's, and the ports ``port … port + replicas - 1`` for the
    ``replicas`` ingress replicas, each variable only where ``environ`` does not set it already (a
    user's own value wins). Nothing when joining a cluster: its nodes' environment decides there."""
    if not starts_local_ray(address, environ):
        return {}
    wanted = {**SERVE_THROUGHPUT_ENV, DIRECT_INGRESS_PORTS[0]: str(port), DIRECT_INGRESS_PORTS[1]: str(port + replicas)}
    return {name: value for name, value in wanted.items() if name not in environ}


def starts_local_ray(address: str | None, environ: dict[str, str]) -> bool:
    """Whether connecting to ``address`` (``ray.address``) starts a Ray of this process's own."""
    return address in (None, "local") and not environ.get("RAY_ADDRESS")


def direct_ingress_ports(environ: dict[str, str]) -> range | None:
    """The ports on which the ingress replicas of a Ray started with ``environ`` answer HTTP
    themselves (Ray Serve's direct ingress: on where ``RAY_SERVE_ENABLE_DIRECT_INGRESS`` is 1, or
    unset in the throughput mode), or None: Serve's proxy answers on the port given to
    ``serve.start``."""
    default = "1" if environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED") == "1" else "0"
    if environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS", default) != "1":
        return None
    return range(int(environ.get(DIRECT_INGRESS_PORTS[0], "30000")), int(environ.get(DIRECT_INGRESS_PORTS[1], "31000")))


def check_ports_free(host: str, ports: range) -> None:
    """UsageError naming the first of ``ports`` on ``host`` that something already listens on (or
    that ``host`` cannot bind): checked before a local Ray starts, so a busy port is one line in a
    second instead of a deployment that fails after Ray and the replicas started."""
    for port in ports:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds: a closed one's port is free
            try:
                probe.bind((host, port))
            except OSError as error:
                raise UsageError(f"--port: {host}:{port} cannot be listened on ({error.strerror}); "
                                 f"choose another --port") from None


def token_sha256(token: str) -> str:
    """The sha256 (hex) of a bearer token: what the settings hold instead of the secret."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a positive number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"a number >= 0, got {text}")
    return value


def add_serve_options(serve: argparse.ArgumentParser) -> None:
    """The options of ``orchestrator serve FILE``."""
    serve.add_argument("file", help="pipeline YAML whose lineage and gallery to serve")
    add_pipeline_options(serve, ("storage", "lineage", "ray_address"))
    serve.add_argument("--host", default="127.0.0.1", help="address the server listens on")
    serve.add_argument("--port", type=int_at_least(1), default=8000,
                       help="port the server listens on (several ingress replicas on a local Ray: the first one's, "
                            "the next ones on the next ports)")
    serve.add_argument("--replicas", type=int_at_least(1), default=1,
                       help="ingress replicas: HTTP, lineage following, merge (with --search-replicas 0 each also "
                            "holds the whole snapshot)")
    serve.add_argument("--encoder-replicas", type=int_at_least(1), default=1,
                       help="replicas that hold the models and embed image queries")
    serve.add_argument("--search-replicas", type=int_at_least(0), default=0,
                       help="shard-search replicas, replica i holding the shards i mod N (0, the default: no pools, "
                            "each ingress replica holds the whole snapshot and searches in its own process)")
    serve.add_argument("--replica-cpus", type=positive_float, default=1.0, metavar="CPUS",
                       help="CPUs Ray reserves for each replica that embeds or searches")
    serve.add_argument("--token-env", metavar="NAME",
                       help="environment variable holding the bearer token every request but /healthz must carry")
    serve.add_argument("--read-prefix", action="append", default=[], metavar="URI",
                       help="a location below which image queries may be named by URI (repeatable; none: no URIs)")
    serve.add_argument("--poll", type=float, default=1.0, metavar="SECONDS",
                       help="seconds between two reads of the lineage (deployment and shard map)")
    serve.add_argument("--max-queries", type=int_at_least(1), default=256, help="most queries in one request")
    serve.add_argument("--max-k", type=int_at_least(1), default=1000, help="most hits per query a request may ask for (k)")
    serve.add_argument("--max-body-mb", type=int_at_least(1), default=8, help="largest request body, in MiB")
    serve.add_argument("--body-timeout", type=positive_float, default=10.0, metavar="SECONDS",
                       help="seconds a request's body may take to arrive (408 after)")
    serve.add_argument("--max-batch", type=int_at_least(1), default=DEFAULT_MAX_BATCH, metavar="REQUESTS",
                       help="concurrent search requests an ingress replica answers with one routed search at most")
    serve.add_argument("--batch-wait", type=non_negative_float, default=DEFAULT_BATCH_WAIT_S, metavar="SECONDS",
                       help="seconds a batch waits after its first request for more (0: only those already queued; "
                            f"default {DEFAULT_BATCH_WAIT_S})")
    serve.add_argument("--concurrent-batches", type=int_at_least(1), default=DEFAULT_CONCURRENT_BATCHES,
                       metavar="BATCHES", help="search batches an ingress replica answers at once")
    serve.add_argument("--access-log", action="store_true",
                       help="a line per request in Ray Serve's replica logs (method, route, status, latency; off by "
                            "default: its formatting costs about a tenth of the requests a replica answers)")
    serve.add_argument("--criterion-metric", default="map", choices=METRICS,
                       help="recorded metric of the compatibility criterion that admits older shards")
    serve.add_argument("--skip-incompatible", action="store_true",
                       help="serve only the shards the serving generation is compatible with (default: keep the "
                            "last servable snapshot)")


def parse_serve_arguments(argv: list[str]) -> argparse.Namespace:
    """The parsed options of ``orchestrator serve ARGV…`` (exits with a usage error, as the CLI)."""
    parser = argparse.ArgumentParser(prog="orchestrator serve")
    add_serve_options(parser)
    return parser.parse_args(argv)


def pools_of(args: argparse.Namespace) -> Pools:
    """The ``Pools`` of the parsed arguments."""
    return Pools(args.replicas, args.encoder_replicas, args.search_replicas, args.replica_cpus)


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    """``ServeSettings`` of the parsed arguments: the pipeline loaded with its storage made absolute
    (replicas may run in another working directory). ValueError naming a bad value."""
    from orchestrator.config import load_pipeline
    from orchestrator.pipeline.runner import storage_root

    if args.poll <= 0:
        raise ValueError(f"--poll: a positive number of seconds, got {args.poll}")
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise ValueError(f"--token-env: environment variable {args.token_env} is not set or empty")
    overrides = pipeline_overrides(args)
    config = load_pipeline(args.file, overrides)
    config = load_pipeline(args.file, {**overrides, "storage": storage_root(config.storage)})
    limits = Limits(max_body_bytes=args.max_body_mb << 20, max_queries=args.max_queries, max_k=args.max_k,
                    body_timeout_s=args.body_timeout)
    return ServeSettings(config, token_sha256(token) if token else None, tuple(args.read_prefix), limits, args.poll,
                         args.criterion_metric, "skip" if args.skip_incompatible else "refuse",
                         lease_prefix=f"serve-{secrets.token_hex(4)}", max_batch=args.max_batch,
                         batch_wait_s=args.batch_wait, concurrent_batches=args.concurrent_batches,
                         access_log=args.access_log)
