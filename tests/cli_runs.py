"""Running the ``orchestrator`` command from the end-to-end tests, two ways with one result type.

- ``cli``: a subprocess, as a user runs it (the process boundary, the import, the exit code). Every
  ``run`` and ``tune`` goes this way: they start a Ray of their own, which must not be this
  process's.
- ``cli_in_process``: ``orchestrator.cli.main`` called here, with its stdout/stderr captured and
  the working directory set. Same parser, handlers and exit codes, without the five seconds a new
  interpreter spends importing torch and timm; for the commands that start no Ray (``search``,
  ``verify``, ``deploy``, ``gc``, ``lineage``), called many times per test.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.cli import main

STARTS_RAY = {"run", "tune"}


def cli(*args: str, cwd: Path, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def cli_in_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    assert args and args[0] not in STARTS_RAY, f"`orchestrator {args[0]}` starts Ray: use cli()"
    out, err = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(previous)
    return subprocess.CompletedProcess(["orchestrator", *args], code, out.getvalue(), err.getvalue())
