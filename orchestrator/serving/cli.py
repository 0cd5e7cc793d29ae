"""``orchestrator serve FILE``: serve a pipeline's gallery over HTTP on Ray Serve, following its
lineage live (docs/serving.md).

Binds to 127.0.0.1 unless ``--host`` says otherwise. ``--token-env NAME``: requests need
``Authorization: Bearer $NAME`` (the token is read from that environment variable, never from the
command line, where other users of the machine could read it). Image queries by URI read only
below the ``--read-prefix`` locations. Runs until interrupted (Ctrl-C or SIGTERM).
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import time

from orchestrator.cli_options import add_pipeline_options, int_at_least, pipeline_overrides
from orchestrator.metrics.names import METRICS


def add_serve_command(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve the gallery over HTTP on Ray Serve (POST /search, GET /status), "
                                               "following deployments, backfills and rollbacks live")
    serve.add_argument("file", help="pipeline YAML whose lineage and gallery to serve")
    add_pipeline_options(serve, ("storage", "lineage", "ray_address"))
    serve.add_argument("--host", default="127.0.0.1", help="address the HTTP proxy listens on")
    serve.add_argument("--port", type=int_at_least(1), default=8000, help="port the HTTP proxy listens on")
    serve.add_argument("--replicas", type=int_at_least(1), default=1,
                       help="ingress replicas: HTTP, lineage following, merge (with --search-replicas 0 each also "
                            "holds the whole snapshot)")
    serve.add_argument("--encoder-replicas", type=int_at_least(1), default=1,
                       help="replicas that hold the models and embed image queries")
    serve.add_argument("--search-replicas", type=int_at_least(0), default=1,
                       help="shard-search replicas, replica i holding the shards i mod N (0: one process searches, "
                            "each ingress replica holding the whole snapshot)")
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
    serve.add_argument("--criterion-metric", default="map", choices=METRICS,
                       help="recorded metric of the compatibility criterion that admits older shards")
    serve.add_argument("--skip-incompatible", action="store_true",
                       help="serve only the shards the serving generation is compatible with (default: keep the "
                            "last servable snapshot)")
    serve.set_defaults(handler=serve_command)


def parse_serve_arguments(argv: list[str]) -> argparse.Namespace:
    """The parsed options of ``orchestrator serve ARGV…`` (exits with a usage error, as the CLI)."""
    parser = argparse.ArgumentParser(prog="orchestrator")
    add_serve_command(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["serve", *argv])


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"a positive number, got {text}")
    return value


def pools_of(args: argparse.Namespace):
    """The ``serving.app.Pools`` of the parsed arguments."""
    from orchestrator.serving.app import Pools

    return Pools(args.replicas, args.encoder_replicas, args.search_replicas, args.replica_cpus)


def serve_command(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM (to this process or its process group, as Ctrl-C sends it;
    also while starting), then stop (``serving.app.stop_server``) without being interrupted again."""
    settings = serve_settings(args)
    from orchestrator.distributed.runtime import connect
    from orchestrator.serving.app import start_server, stop_server

    connect(settings.config.ray.address)
    # after connecting (ray.init installs a SIGTERM handler of its own), and explicitly: a command
    # started in the background of a shell script inherits SIGINT ignored
    on_stop_signals(signal.default_int_handler)
    try:
        url = start_server(settings, args.host, args.port, pools_of(args))
        print(f"serving gallery {settings.config.gallery.name!r} at {url} (POST /search, GET /status, /healthz, "
              f"/metrics)", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("stopping", flush=True)
    finally:
        on_stop_signals(signal.SIG_IGN)
        print(f"stopped: {stop_server(settings)}", flush=True)
    return 0


def on_stop_signals(handler) -> None:
    """``handler`` for SIGINT and SIGTERM."""
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, handler)


def serve_settings(args: argparse.Namespace):
    """``ServeSettings`` of the parsed arguments: the pipeline loaded with its storage made absolute
    (replicas may run in another working directory). ValueError naming a bad value."""
    from orchestrator.config import load_pipeline
    from orchestrator.pipeline.runner import storage_root
    from orchestrator.serving.endpoint import ServeSettings, token_sha256
    from orchestrator.serving.requests import Limits

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
                         lease_prefix=f"serve-{secrets.token_hex(4)}")
