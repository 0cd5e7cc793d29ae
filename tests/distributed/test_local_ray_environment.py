"""What the workers of the orchestrator's local Ray (``runtime.connect``) find in their environment:
``WORKER_ENV_VARS``, the isolation variable and the driver's own variables (ORCHESTRATOR_PLUGINS
among them), passed through the environment the new Ray's processes inherit rather than a runtime
environment; and the driver's own environment as it was before. Run in a process of its own, so
the variables it sets touch no other test."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.distributed.runtime import NO_STATE_API, WORKER_ENV_VARS

pytestmark = pytest.mark.e2e

PROBE = """
import json, os, ray
from orchestrator.distributed.runtime import connect
names = ["ORCHESTRATOR_PLUGINS", "RAY_API_SERVER_ADDRESS", *json.loads(os.environ["PROBE_NAMES"])]
connect()
@ray.remote(num_cpus=0)
def environment():
    return {name: os.environ.get(name) for name in names}
seen = ray.get(environment.remote(), timeout=120)
process = {name: os.environ.get(name) for name in names}
ray.shutdown()
print(json.dumps({"worker": seen, "driver": process}))
"""


def test_workers_get_the_worker_variables_and_the_drivers_plugins_and_the_driver_keeps_its_own():
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", *WORKER_ENV_VARS)}
    environment.update(ORCHESTRATOR_PLUGINS="some_plugin_module", PROBE_NAMES=json.dumps(list(WORKER_ENV_VARS)))
    run = subprocess.run([sys.executable, "-c", PROBE], env=environment, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["worker"] == {"ORCHESTRATOR_PLUGINS": "some_plugin_module", "RAY_API_SERVER_ADDRESS": NO_STATE_API,
                              **WORKER_ENV_VARS}
    # the driver's environment is as it was: the variables were set only while Ray started
    assert seen["driver"] == {"ORCHESTRATOR_PLUGINS": "some_plugin_module", "RAY_API_SERVER_ADDRESS": None,
                              **{name: None for name in WORKER_ENV_VARS}}
