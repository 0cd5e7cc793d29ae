"""The in-process local Ray that test fixtures start.

Under ``pytest -n 2`` one worker process runs test groups one after another, and the tuning
tests' session fixture keeps its Ray until the session ends; a later group's fixture then found
Ray already initialised in the process ("Maybe you called ray.init twice"). Groups run whole and
in one worker, so a Ray still held when a fixture starts belongs to a group that has finished."""
from __future__ import annotations

import ray

from orchestrator.distributed import runtime


def start_local_ray(runtime_env: dict | None = None) -> str:
    """Shut down any Ray this process still holds, start a new local instance the way the
    orchestrator does (2 CPUs, no dashboard, never joining another Ray on the machine, its workers
    asking only its own state API); returns its GCS address."""
    if ray.is_initialized():
        ray.shutdown()
    runtime.start_local_ray(num_cpus=2, runtime_env=runtime_env)
    return ray.get_runtime_context().gcs_address
