"""A test lane's fork server for ``orchestrator`` commands (``cli_runs.orchestrator_process``).

Run as ``python cli_fork_server.py SOCKET``: imports what ``orchestrator run`` imports (torch, timm,
Ray, Ray Data, Ray Train: about 4 s of a core, inside the command's own start-up phase), then for
each connection on the Unix socket ``SOCKET`` forks a child that runs one command as
``python -m orchestrator`` would, from that point on: its arguments, working directory and
environment from the request, its stdout and stderr the two pipe ends sent with it, stdin
/dev/null, a session of its own when asked. The connection gets the child's pid, then its exit
status (``os.waitstatus_to_exitcode``) when it ends. The child leaves through the interpreter's
normal exit, so the handlers a command registers (Ray's shutdown) run as in a fresh process.

Nothing runs in this process but imports: no thread pool of torch's has run and Ray is not
initialised, so a fork of it is a clean start.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys


def serve(path: str) -> tuple[dict, list[int]]:
    """Fork one child per request; return (request, [stdout fd, stderr fd]) in the child, never in
    this process, which exits once its stdin has closed (the lane ended, or keeps fewer servers)
    and every child it forked has ended and been reported."""
    listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}  # child pid → the connection that asked for it
    while listener is not None or waiting:
        inputs = [sys.stdin, listener] if listener is not None else []
        readable, _, _ = select.select(inputs, [], [], 0.1)
        if sys.stdin in readable and not sys.stdin.readline():
            listener.close()
            listener = None
        elif listener is not None and listener in readable:
            connection, _ = listener.accept()
            message, fds, _flags, _address = socket.recv_fds(connection, 1 << 20, 2)
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in waiting.values():
                    other.close()
                connection.close()
                return json.loads(message), fds
            for fd in fds:
                os.close(fd)
            connection.sendall(f"pid {pid}\n".encode())
            waiting[pid] = connection
        for pid in list(waiting):
            ended, status = os.waitpid(pid, os.WNOHANG)
            if ended:
                connection = waiting.pop(pid)
                try:
                    connection.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass  # the asking side is gone
                connection.close()
    sys.exit(0)


def become_the_command(request: dict, fds: list[int]) -> int:
    """In the child: the request's streams, folder, environment and session, then the command."""
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in {stdin, *fds}:
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if request["new_session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["orchestrator", *request["args"]]
    from orchestrator.cli import main

    return main(request["args"])


if __name__ == "__main__":
    from orchestrator.gc_startup import startup_phase

    with startup_phase():  # what `orchestrator run` imports (cli._run_command)
        import orchestrator.cli  # noqa: F401
        import orchestrator.pipeline.runner  # noqa: F401
    sys.exit(become_the_command(*serve(sys.argv[1])))
