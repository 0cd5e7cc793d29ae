"""What the serving tests' clients use: digits of the test split as PNG files (query files of
``orchestrator search``), the ``POST /search`` body of the same files, a free loopback port."""
from __future__ import annotations

import base64
import json
import random
import socket
from pathlib import Path

from PIL import Image

from orchestrator.data import load_digits


def png_files(folder: Path, n: int) -> list[Path]:
    """The first n test-split digits as PNG files (query files of `orchestrator search`)."""
    paths = []
    for number, image in enumerate(load_digits("test").images[:n]):
        paths.append(folder / f"q{number}.png")
        Image.fromarray(image).save(paths[-1])
    return paths


def search_body(paths: list[Path], **fields) -> bytes:
    return json.dumps({"images": [base64.b64encode(p.read_bytes()).decode() for p in paths], **fields}).encode()


#: Where ``free_port`` looks: below Linux's ephemeral range (32768-60999, where the system picks the
#: local port of every outgoing connection) and above Ray's worker ports (10002-19999), so that the
#: seconds between finding the port and a server binding it (a Ray to start first) leave nothing
#: that could take it but another listener choosing this very port.
FREE_PORT_RANGE = range(20000, 30000)


def free_port() -> int:
    """A loopback port nothing listens on now, drawn from ``FREE_PORT_RANGE``. A port the system
    hands out for port 0 is an ephemeral one: an outgoing connection (Ray opens many as it starts)
    may take it before the server that was told it binds it (CI, 2026-12-05: EADDRINUSE)."""
    for port in random.Random().sample(FREE_PORT_RANGE, 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {FREE_PORT_RANGE.start}-{FREE_PORT_RANGE.stop - 1} after 200 tries")
