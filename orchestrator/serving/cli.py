"""``orchestrator serve FILE``: serve a pipeline's gallery over HTTP on Ray Serve, following its
lineage live (docs/serving.md).

Binds to 127.0.0.1 unless ``--host`` says otherwise. ``--token-env NAME``: requests need
``Authorization: Bearer $NAME`` (the token is read from that environment variable, never from the
command line, where other users of the machine could read it). Image queries by URI read only
below the ``--read-prefix`` locations. Runs until interrupted (Ctrl-C or SIGTERM). The options,
and the settings they make, are ``serving.settings``'.
"""
from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from orchestrator.serving.settings import (
    add_serve_options,
    check_ports_free,
    direct_ingress_ports,
    local_ray_serve_env,
    pools_of,
    serve_settings,
    starts_local_ray,
)


def add_serve_command(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser("serve", help="serve the gallery over HTTP on Ray Serve (POST /search, GET /status), "
                                               "following deployments, backfills and rollbacks live")
    add_serve_options(serve)
    serve.set_defaults(handler=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM (to this process or its process group, as Ctrl-C sends it;
    also while starting), then stop (``serving.app.stop_server``) without being interrupted again."""
    settings = serve_settings(args)
    from orchestrator.distributed.runtime import connect
    from orchestrator.serving.app import start_server, stop_server

    pools = pools_of(args)
    address = settings.config.ray.address
    os.environ.update(local_ray_serve_env(address, dict(os.environ), args.port, pools.replicas))
    # a Ray this command starts listens as its environment says; a cluster's nodes' environment is not known here
    local = starts_local_ray(address, dict(os.environ))
    direct = direct_ingress_ports(dict(os.environ)) if local else None
    listening = direct[:pools.replicas] if direct is not None else range(args.port, args.port + 1)
    if local:  # a cluster's head node is not this machine
        check_ports_free(args.host, listening)
    connect(address)
    # after connecting (ray.init installs a SIGTERM handler of its own), and explicitly: a command
    # started in the background of a shell script inherits SIGINT ignored
    on_stop_signals(signal.default_int_handler)
    try:
        url = start_server(settings, args.host, args.port, pools, direct)
        others = f" (ingress replicas on ports {listening[0]}-{listening[-1]})" if len(listening) > 1 else ""
        print(f"serving gallery {settings.config.gallery.name!r} at {url}{others} (POST /search, GET /status, "
              f"/healthz, /metrics)", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("stopping", flush=True)
    finally:
        on_stop_signals(signal.SIG_IGN)
        print(f"stopped: {stop_server(settings)}", flush=True)
    return 0


def on_stop_signals(handler: Callable[[int, Any], Any] | int) -> None:
    """``handler`` (a function, or ``signal.SIG_IGN``) for SIGINT and SIGTERM."""
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, handler)
