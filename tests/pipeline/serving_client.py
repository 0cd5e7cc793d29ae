"""What the serving tests' clients use: digits of the test split as PNG files (query files of
``orchestrator search``), the ``POST /search`` body of the same files, a free loopback port."""
from __future__ import annotations

import base64
import json
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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
