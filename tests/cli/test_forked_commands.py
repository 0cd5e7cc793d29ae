"""The end-to-end tests' way of running ``orchestrator`` (``cli_runs``: forks of a per-lane fork
server) answers as a new interpreter does: the same exit code, stdout and stderr, in the asked
folder and environment; a killed one is seen killed; and a command asked with another value of a
variable that a module may read on import gets a server started with that value."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cli_runs
from cli_runs import cli, orchestrator_process

pytestmark = pytest.mark.e2e

QUICKSTART = str(Path(__file__).resolve().parents[2] / "pipelines" / "quickstart.yaml")


@pytest.mark.parametrize(("args", "variables"), [
    (("--version",), {}),
    (("run", "missing.yaml"), {}),  # a file of the asked folder
    (("lineage",), {}),
    (("run", QUICKSTART, "--storage", "run"), {"ORCHESTRATOR_PLUGINS": "no_such_plugin_module"}),  # read when used
    (("run", QUICKSTART, "--storage", "run"), {"OMP_NUM_THREADS": "1", "ORCHESTRATOR_PLUGINS": "no_such_module"}),
])
def test_a_forked_command_answers_as_a_new_interpreter(tmp_path, args, variables):
    env = {**os.environ, **variables}
    forked = orchestrator_process(*args, cwd=tmp_path, env=env)
    out, err = forked.communicate(timeout=120)
    fresh = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
    assert (forked.returncode, out, err) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_a_killed_command_in_a_session_of_its_own_is_seen_killed(tmp_path):
    process = orchestrator_process("run", QUICKSTART, "--storage", str(tmp_path / "run"), cwd=tmp_path,
                                   merge_stderr=True, new_session=True)
    time.sleep(1.0)  # validating its file or starting its Ray: a run takes far longer
    assert process.poll() is None
    os.killpg(process.pid, signal.SIGKILL)  # a session of its own: the group is its own
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL


def test_a_variable_read_on_import_gets_its_own_server(tmp_path):
    cli("--version", cwd=tmp_path)
    before = set(map(id, cli_runs._SERVERS.values()))
    cli_env = {**os.environ, "A_VARIABLE_ONLY_THIS_TEST_SETS": "1"}  # a module could read it on import
    assert orchestrator_process("--version", cwd=tmp_path, env=cli_env).communicate(timeout=60)[0]
    started = set(map(id, cli_runs._SERVERS.values())) - before
    assert len(started) == 1
    # a variable read when used does not start another
    orchestrator_process("--version", cwd=tmp_path, env={**cli_env, "AWS_PROFILE": "x"}).communicate(timeout=60)
    assert set(map(id, cli_runs._SERVERS.values())) - before == started
    assert len(cli_runs._SERVERS) <= cli_runs.KEPT_SERVERS


def test_a_lane_that_holds_more_than_1024_descriptors_still_runs_commands(tmp_path):
    """A lane's own descriptors (Ray's, the servers', sockets) went past 1024 in the suite, where
    ``select.select`` refuses a descriptor; the command's connection is then numbered above it."""
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        assert cli("--version", cwd=tmp_path).returncode == 0
    finally:
        for fd in held:
            os.close(fd)
