"""Running the ``orchestrator`` command from the end-to-end tests, two ways with one result type.

- ``cli`` / ``orchestrator_process``: a process of its own, as a user runs it (the process
  boundary, its own Ray, the exit code). Every ``run`` and ``tune`` goes this way: they start a Ray
  of their own, which must not be this process's. The process is a fork of one of this lane's fork
  servers (``cli_fork_server.py``), each of which has imported what ``orchestrator run`` imports
  once: the ~4 s of a core that a new interpreter spends importing torch, timm and Ray are not
  spent again for each of the suite's ~40 runs. A server is started with the environment the
  command asks for, but for the variables read when used rather than when a module is imported
  (``SAFE_TO_DIFFER``, set in the child), so a forked command imports under the environment a new
  interpreter would see: a lane keeps one server per such environment (an in-process Ray adds
  variables to the lane's own, a test may pass its own), the latest ``KEPT_SERVERS``. New
  interpreters (``python -m orchestrator``) remain where the import itself is tested
  (tests/cli/test_quick_answers.py) and in the scripts users run (the examples, the walkthrough's
  ``ray job submit``, the multi-node cluster's run).
- ``cli_in_process``: ``orchestrator.cli.main`` called here, with its stdout/stderr captured and
  the working directory set. Same parser, handlers and exit codes, without the five seconds a new
  interpreter spends importing torch and timm; for the commands that start no Ray (``search``,
  ``verify``, ``deploy``, ``gc``, ``lineage``), called many times per test.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import json
import locale
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from orchestrator.cli import main

STARTS_RAY = {"run", "tune"}
FORK_SERVER = Path(__file__).resolve().parent / "cli_fork_server.py"
#: Variables read when used, not when a module is imported: a forked command may be given other values.
SAFE_TO_DIFFER = re.compile(r"AWS_\w+|PGPASSWORD|RAY_ADDRESS|ORCHESTRATOR_PLUGINS|PYTEST_CURRENT_TEST")
KEPT_SERVERS = 2


def cli(*args: str, cwd: Path, timeout: float = 1200) -> subprocess.CompletedProcess:
    process = orchestrator_process(*args, cwd=cwd)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return subprocess.CompletedProcess(["orchestrator", *args], process.returncode, out, err)


def orchestrator_process(*args: str, cwd: Path, env: dict[str, str] | None = None, merge_stderr: bool = False,
                         new_session: bool = False) -> ForkedProcess:
    """``orchestrator ARGS`` started in ``cwd`` with ``env`` (default: this process's), its stdout
    and stderr pipes of text (one pipe when ``merge_stderr``), in a session of its own when
    ``new_session``, forked by the lane's fork server for that environment."""
    env = dict(os.environ if env is None else env)
    return ForkedProcess(_fork_server(env).socket_path, list(args), Path(cwd), env, merge_stderr, new_session)


class _ForkServer:
    """One ``cli_fork_server.py`` of this lane, started with ``environment``, ended with the lane
    (or when a lane keeps more than ``KEPT_SERVERS``)."""

    def __init__(self, environment: dict[str, str]):
        self.folder = tempfile.mkdtemp(prefix="orc-fork-")
        self.socket_path = os.path.join(self.folder, "s")
        self.process = subprocess.Popen([sys.executable, str(FORK_SERVER), self.socket_path], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=environment)
        ready = self.process.stdout.readline()
        assert ready == "ready\n", f"the fork server did not start: {ready!r}"
        atexit.register(self.end)

    def close(self) -> None:
        """Close its stdin: it takes no new command and ends when its running ones have."""
        if not self.process.stdin.closed:
            self.process.stdin.close()

    def end(self) -> None:
        """At the lane's end: closed, waited for, its socket's folder removed."""
        self.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        with contextlib.suppress(OSError):
            os.unlink(self.socket_path)
            os.rmdir(self.folder)


_SERVERS: dict[tuple[tuple[str, str], ...], _ForkServer] = {}  # by the environment imports may read, oldest first


def _fork_server(env: dict[str, str]) -> _ForkServer:
    key = tuple(sorted((name, value) for name, value in env.items() if not SAFE_TO_DIFFER.fullmatch(name)))
    server = _SERVERS.pop(key, None)
    if server is None or server.process.poll() is not None:
        server = _ForkServer(env)
    _SERVERS[key] = server
    while len(_SERVERS) > KEPT_SERVERS:
        _SERVERS.pop(next(iter(_SERVERS))).close()
    return server


class ForkedProcess:
    """A command forked by the lane's fork server, with the part of ``subprocess.Popen`` the tests
    use. Its exit status comes from the server (its parent) over the request's connection."""

    def __init__(self, socket_path: str, args: list[str], cwd: Path, env: dict[str, str], merge_stderr: bool,
                 new_session: bool):
        self.args, self.returncode = ["orchestrator", *args], None
        out_read, out_write = os.pipe()
        err_read, err_write = (None, out_write) if merge_stderr else os.pipe()
        request = {"args": args, "cwd": str(cwd), "env": env, "new_session": new_session}
        self.connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.connection.connect(socket_path)
        socket.send_fds(self.connection, [json.dumps(request).encode()], [out_write, err_write])
        os.close(out_write)
        if not merge_stderr:
            os.close(err_write)
        encoding = locale.getpreferredencoding(False)
        self.stdout = open(out_read, encoding=encoding)
        self.stderr = None if err_read is None else open(err_read, encoding=encoding)
        self._received = b""
        self.pid = int(self._line(timeout=60).removeprefix("pid "))

    def _line(self, timeout: float | None) -> str:
        """The next line from the server; "" when none came within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        readable = select.poll()  # not select.select, which refuses descriptors numbered above 1024
        readable.register(self.connection, select.POLLIN)
        while b"\n" not in self._received:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not readable.poll(None if left is None else left * 1000):
                return ""
            chunk = self.connection.recv(256)
            if not chunk:
                raise RuntimeError(f"the fork server closed the connection of {self.args}")
            self._received += chunk
        line, self._received = self._received.split(b"\n", 1)
        return line.decode()

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._line(timeout)
            if not line:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = int(line.removeprefix("exit "))
            self.connection.close()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        """Everything the command writes until it ends, as ``Popen.communicate`` gives it."""
        texts: dict[str, str] = {}
        readers = [threading.Thread(target=lambda n=name, s=stream: texts.__setitem__(n, s.read()), daemon=True)
                   for name, stream in (("out", self.stdout), ("err", self.stderr)) if stream is not None]
        for reader in readers:
            reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(1.0, deadline - time.monotonic()))
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return texts["out"], texts.get("err")

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


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


#: What ``orchestrator_process`` returns.
Running = ForkedProcess
