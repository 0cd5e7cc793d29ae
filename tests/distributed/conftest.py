"""One local Ray (2 CPUs) for the distributed tests, started once for the package and stopped
after its last test (before the modules that start clusters of their own). Its workers get the
environment ``orchestrator run`` gives a local Ray (``connect``): Ray Train's controller polls its
workers every 0.2 s instead of 2 s."""
from __future__ import annotations

import pytest
import ray

from orchestrator.distributed.runtime import WORKER_ENV_VARS


@pytest.fixture(scope="package")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": WORKER_ENV_VARS})
    yield
    ray.shutdown()
