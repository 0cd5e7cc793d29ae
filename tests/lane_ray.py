"""One local Ray per test lane, which the lane's ``orchestrator run`` and ``tune`` commands join.

A command that starts its own local Ray pays, each time, for Ray's daemons (GCS, raylet, the
dashboard and runtime-environment agents, the log monitor: about 5 s of a core) and for the
helper actors Ray Data keeps once per cluster (its stats actor, autoscaling coordinator and actor
location tracker: about 3.5 s), and the suite runs about forty such commands. Joining a running
Ray (``RAY_ADDRESS``, as a user does with ``ray.address: auto`` or ``ray job submit``) spends
neither again: the lane starts this one Ray the first time a command asks for it, and it ends
with the lane.

The Ray is started by a process of its own (``python tests/lane_ray.py``, this module run as a
script) with ``runtime.start_local_ray``, so it is what a command's own local Ray is: 2 CPUs, no
dashboard, its workers asking only its own state API, and ``WORKER_ENV_VARS`` in every worker's
environment (inherited from the holder, since a joining command's own runtime environment does
not carry them). Each command is a Ray job of its own: its workers and actors end with it (a
killed command's too, once Ray sees its driver gone); what outlives a job is what Ray keeps per
cluster (Ray Data's detached helpers).

A command keeps its own local Ray when what it tests is that Ray (``cli_runs.orchestrator_process``
decides): the runs killed with their process group, a plug-in module the workers must import
(``ORCHESTRATOR_PLUGINS`` reaches a local Ray's workers only through the environment it starts
with), a run with Ray's dashboard, and any command given its own ``RAY_ADDRESS``.
"""
from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from pathlib import Path

#: Variables of the lane the holder does not pass on to its Ray's workers.
NOT_INHERITED = ("RAY_ADDRESS", "ORCHESTRATOR_PLUGINS", "PYTEST_CURRENT_TEST")


class _Holder:
    """The process that started the lane's Ray and keeps it until its stdin closes."""

    def __init__(self) -> None:
        environment = {name: value for name, value in os.environ.items() if name not in NOT_INHERITED}
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve())], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=environment, start_new_session=True)
        line = self.process.stdout.readline().strip()
        if not line.startswith("address "):
            self.end()
            raise RuntimeError(f"the lane's Ray did not start: {line!r} (exit {self.process.poll()})")
        self.address = line.removeprefix("address ")
        atexit.register(self.end)

    def alive(self) -> bool:
        return self.process.poll() is None

    def end(self) -> None:
        """Its stdin closed: the holder shuts its Ray down and exits."""
        if not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_holder: _Holder | None = None


def address() -> str:
    """The GCS address of this lane's Ray, started now if it is not running (or has ended)."""
    global _holder
    if _holder is None or not _holder.alive():
        _holder = _Holder()
    return _holder.address


def driver_pids() -> set[int]:
    """The pids of every driver that has joined this lane's Ray (Ray's job table, from the holder)."""
    address()
    _holder.process.stdin.write("drivers\n")
    _holder.process.stdin.flush()
    return set(json.loads(_holder.process.stdout.readline()))


def hold() -> None:
    """The holder process: start the local Ray, print its GCS address, answer each "drivers" line
    with the job table's driver pids (a JSON list), shut the Ray down when stdin closes."""
    import ray
    from ray._private.state import state

    from orchestrator.distributed.runtime import WORKER_ENV_VARS, start_local_ray

    start_local_ray(num_cpus=2, runtime_env={"env_vars": dict(WORKER_ENV_VARS)})
    print("address", ray.get_runtime_context().gcs_address, flush=True)
    for line in sys.stdin:
        if line.strip() == "drivers":
            print(json.dumps([job["DriverPid"] for job in state.job_table()]), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    hold()
