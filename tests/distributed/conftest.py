"""The local Ray (2 CPUs) of the distributed tests: one per module, stopped after the module's last
test. Not wider: without an ``__init__.py`` a "package" fixture lives until the session ends, and a
Ray left running makes the cluster scripts of later tests wait for it (examples/cluster_walkthrough.sh).
Its workers get the environment ``orchestrator run`` gives a local Ray (``connect``): Ray Train's
controller polls its workers every 0.2 s instead of 2 s."""
from __future__ import annotations

import pytest
import ray

from local_ray import start_local_ray
from orchestrator.distributed.runtime import WORKER_ENV_VARS


@pytest.fixture(scope="module")
def local_ray():
    start_local_ray(runtime_env={"env_vars": WORKER_ENV_VARS})
    yield
    ray.shutdown()
