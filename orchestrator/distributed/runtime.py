"""Connecting to Ray: a local instance with the environment training needs, or a cluster."""
from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from orchestrator.errors import OutsideSystemError, one_line

log = logging.getLogger(__name__)

# Ray Train 2.60 hands a worker's ``ray.train.report`` to the controller only when the controller
# polls its workers (every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s by default), and a worker's next
# report waits for that: epochs shorter than the interval were paced by it (benchmarks/README.md).
# A local Ray is one node that no autoscaler drains, so Ray Train's preemption watcher (an actor per
# training run that polls the nodes' drain state: about 1.3 s of CPU to start, every run) has
# nothing to watch there; on a cluster it is Ray's default, on.
WORKER_ENV_VARS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}

# Ray Train 2.60 starts, for every run, a detached placement-group cleaner that asks the Ray state
# API whether the run's controller is alive, and removes the run's placement group (its workers die)
# when the actor is not found. A worker finds the state API through RAY_ADDRESS, else through the
# last `ray start` on the machine or the one Ray it sees there; and a local Ray without a dashboard
# names 127.0.0.1:8265 as its API server. So the cleaner of a healthy run asked another Ray's
# dashboard on the same machine, did not find its controller there, and killed the run (CI, 2026-11:
# a test's training workers died while the other test lane ran a pipeline with its dashboard).
# A local instance's workers therefore ask their own Ray: without a dashboard the state API's address
# (RAY_API_SERVER_ADDRESS, which Ray looks at before RAY_ADDRESS) is a port nothing can listen on (the
# cleaner then keeps waiting and never removes anything, as on a machine with no other Ray); with
# one, ``pin_worker_to_its_ray`` sets RAY_ADDRESS in every worker process to its Ray's GCS.
NO_STATE_API = "http://127.0.0.1:0"

# Ray 2.60 gives a new local node 30 s (a constant of ``ray._private.node``) to register its raylet
# with its GCS, then raises a bare Exception with this text. On a machine whose cores are all busy
# that happened (the test suite's three lanes on 2 cores, once in four runs), also when the raylet
# crashed because its dashboard agent, importing slowly, missed Ray's fixed 15 s wait for its port
# file (twice in a row in one suite run, 2026-12-06); a later start succeeded.
NODE_START_TIMEOUT = "timed out during startup"
LOCAL_START_ATTEMPTS = 3


def connect(address: str | None = None, dashboard: bool = False) -> str | None:
    """Join the cluster at ``address`` ("auto", host:port, ray://…), or the one RAY_ADDRESS names
    (as under ``ray job submit``); otherwise start a local Ray whose workers get
    ``WORKER_ENV_VARS`` on top of the driver's environment (ORCHESTRATOR_PLUGINS included: a local
    Ray's processes inherit it, ``start_local_ray``), with its dashboard when ``dashboard``.
    Workers' own logs stay in Ray's log files (progress is reported from the training checkpoints).
    No-op when already connected.

    Returns the dashboard's address (``http://127.0.0.1:8265``) when Ray reports one on connecting,
    else None. On a cluster, set the same variables in the cluster's environment (see README).
    A cluster that refuses the connection raises ``OutsideSystemError`` naming its address."""
    import ray

    if ray.is_initialized():
        return None
    if address in (None, "local") and not os.environ.get("RAY_ADDRESS"):
        context = start_local_ray(dashboard=dashboard, runtime_env={"env_vars": dict(WORKER_ENV_VARS)})
    else:
        joined = None if address in (None, "local") else address
        try:
            context = ray.init(address=joined, log_to_driver=False)
        except ConnectionError as error:
            raise OutsideSystemError("Ray", joined or os.environ.get("RAY_ADDRESS", "RAY_ADDRESS"), one_line(error),
                                     "that the cluster's head runs there and its Ray version is this one's") from error
    return dashboard_address(getattr(context, "dashboard_url", None))


def start_local_ray(num_cpus: int | None = None, dashboard: bool = False,
                    runtime_env: dict[str, Any] | None = None):
    """Start a new local Ray in this process and return its context: always a new instance, even
    when a `ray start` cluster runs on this machine (plain ``ray.init()`` would join that one).
    Its workers get ``runtime_env`` and ask only this Ray's state API (``NO_STATE_API`` without a
    dashboard; with one, ``pin_worker_to_its_ray``); their own logs stay in Ray's log files.

    ``runtime_env``'s ``env_vars`` reach the workers through the environment this Ray's processes
    inherit (set while ``ray.init`` starts them, then restored in this process), not as a runtime
    environment: with one, Ray starts every worker process through a setup process of its own
    (measured, Ray 2.60 on an idle core: 0.80 s of CPU per worker instead of 0.46 s, and a
    pipeline run starts about ten). Its other fields (``py_modules``, …) stay the job's runtime
    environment, and so does the setup hook a dashboard needs.

    A node that Ray reports as not started in time (``NODE_START_TIMEOUT``) is started again, up
    to ``LOCAL_START_ATTEMPTS`` starts, after the processes the failed start left (this process's
    new children) are stopped; any other error of ``ray.init`` is raised as it is."""
    import ray

    runtime_env = dict(runtime_env or {})
    if "worker_process_setup_hook" in runtime_env:
        raise ValueError("start_local_ray: runtime_env.worker_process_setup_hook is this function's own")
    env_vars = dict(runtime_env.pop("env_vars", None) or {})
    if dashboard:
        runtime_env["worker_process_setup_hook"] = f"{__name__}.pin_worker_to_its_ray"
    else:
        env_vars["RAY_API_SERVER_ADDRESS"] = NO_STATE_API
    with _environment(env_vars):
        attempt = 1
        while True:
            before = own_child_processes()
            try:
                return ray.init(address="local", num_cpus=num_cpus, include_dashboard=dashboard, log_to_driver=False,
                                runtime_env=runtime_env or None)
            except Exception as error:  # noqa: BLE001  (Ray raises a bare Exception for this one)
                if NODE_START_TIMEOUT not in str(error) or attempt == LOCAL_START_ATTEMPTS:
                    raise
                stopped = stop_processes(own_child_processes() - before)
                log.warning("the local Ray did not start in time (%s); its %d processes stopped, starting it "
                            "again", one_line(error), stopped)
            attempt += 1


def own_child_processes() -> set[int]:
    """The pids of this process's children (Linux's /proc; elsewhere an empty set). A local Ray's
    daemons (GCS, raylet, log monitor, API server, reaper) are the driver's children; the raylet's
    own children (workers, agents) end with it."""
    me = str(os.getpid())
    children = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = stat.read().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue  # ended meanwhile
        if parent == me:
            children.add(int(entry))
    return children


def stop_processes(pids: set[int]) -> int:
    """SIGKILL each of ``pids`` (children of this process) and reap it; returns how many were stopped."""
    stopped = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            stopped += 1
        except (ProcessLookupError, ChildProcessError):
            continue
    return stopped


@contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    """``variables`` set in this process's environment inside the block, the previous values back after."""
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def pin_worker_to_its_ray() -> None:
    """Setup hook of every worker process of ``start_local_ray``'s Ray: RAY_ADDRESS is that Ray's
    GCS, so whatever the worker asks of "the" Ray (the state API, above all) is asked of its own."""
    import ray

    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


def dashboard_address(url: str | None) -> str | None:
    """Ray's ``dashboard_url`` (``127.0.0.1:8265``, empty without a dashboard) as an http address."""
    if not url:
        return None
    return url if "://" in url else f"http://{url}"


def dashboard_message(url: str) -> str:
    """The line a run prints for the dashboard at ``url`` (Ray ≥ 2.59 asks a local dashboard's
    visitors for the cluster's token)."""
    return f"Ray dashboard: {url} (its token, if it asks: ray get-auth-token)"
