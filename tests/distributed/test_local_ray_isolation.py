"""The workers of the orchestrator's local Ray ask only their own Ray's state API, never another
Ray's dashboard on the same machine.

Ray Train's placement-group cleaner removes a run's placement group, and so kills its workers, when
the state API it reaches does not know the run's controller. Before ``start_local_ray`` pinned its
workers, a worker reached whichever dashboard listened on 127.0.0.1:8265 or whichever Ray the
machine's last ``ray start`` named: CI saw a healthy training run killed so while the other test lane
ran a pipeline with its dashboard. Here another Ray with a dashboard runs beside ours, as it did there.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import ray

from orchestrator.distributed.runtime import NO_STATE_API, start_local_ray

pytestmark = pytest.mark.e2e

OTHER_RAY = ("import sys, ray; context = ray.init(address='local', num_cpus=1, include_dashboard=True, "
             "log_to_driver=False); print(context.dashboard_url, flush=True); sys.stdin.read()")


@pytest.fixture(scope="module")
def other_ray_dashboard():
    """Another local Ray with its dashboard (127.0.0.1:8265 when free), alive until the module ends."""
    other = subprocess.Popen([sys.executable, "-c", OTHER_RAY], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    url = other.stdout.readline().strip()
    assert url, "the other Ray did not start"
    yield url
    other.stdin.close()
    other.wait(timeout=120)


@ray.remote(num_cpus=0)
class StateProbe:
    """Asks the state API about itself, the way Ray Train's cleaner asks about a controller."""

    def own_state(self) -> tuple[str, str]:
        import os

        from ray.util.state import get_actor
        from ray.util.state.exception import RayStateApiException

        try:
            found = get_actor(ray.get_runtime_context().get_actor_id(), timeout=10)
        except RayStateApiException as error:
            answer = f"unavailable: {error}"
        else:
            answer = found.state if found is not None else "not found"
        return answer, os.environ.get("RAY_ADDRESS", "")


def probe(dashboard: bool) -> tuple[str, str, str]:
    """(the probe's answer, the RAY_ADDRESS its process has, our GCS address) in a new local Ray."""
    if ray.is_initialized():
        ray.shutdown()
    start_local_ray(num_cpus=1, dashboard=dashboard)
    try:
        answer, worker_address = ray.get(StateProbe.remote().own_state.remote(), timeout=120)
        return answer, worker_address, ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def test_without_a_dashboard_the_state_api_is_unavailable_never_another_rays(other_ray_dashboard):
    answer, worker_address, own_address = probe(dashboard=False)
    assert answer.startswith("unavailable: ") and NO_STATE_API in answer, answer
    # the state API's address (RAY_API_SERVER_ADDRESS) comes before RAY_ADDRESS in Ray's lookup, so
    # without a dashboard the worker needs no RAY_ADDRESS; one it has is its own Ray's
    assert worker_address in ("", own_address)


def test_with_its_dashboard_a_worker_finds_its_own_actor_alive(other_ray_dashboard):
    answer, worker_address, own_address = probe(dashboard=True)
    assert answer == "ALIVE"
    assert worker_address == own_address
