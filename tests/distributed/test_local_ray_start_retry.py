"""A local Ray that Ray reports as not started in time (its raylet not registered with its GCS
within Ray's 30 s, seen once in four suite runs on 2 busy cores, and twice in a row once) is started again by
``start_local_ray``: the failed start's processes stopped first, a warning line, then a Ray that
runs tasks. Ray's own wait is made to run out at once: its clock jumps when the raylet is first
looked up. Run in a process of its own (the patches and the Ray touch no other test)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

PROBE = """
import json, logging, os, time
import ray
import ray._private.node as node
import ray._private.services as services
from orchestrator.distributed import runtime

logging.basicConfig(level=logging.WARNING)


class JumpingClock:
    '''Ray's node module's time: the real one, but for a jump of 1000 s from the first lookup on.'''
    offset = 0.0
    def monotonic(self):
        return time.monotonic() + self.offset
    def __getattr__(self, name):
        return getattr(time, name)


clock, real_get_node, first_start = JumpingClock(), services.get_node, {}
def get_node(*args, **kwargs):
    if not first_start:  # the first start's processes, then its wait runs out
        first_start["children"] = sorted(runtime.own_child_processes())
        clock.offset = 1000.0
        raise RuntimeError("not registered yet")
    return real_get_node(*args, **kwargs)

node.time, services.get_node = clock, get_node
runtime.start_local_ray(num_cpus=1)
answer = ray.get(ray.remote(lambda: 6 * 7).remote(), timeout=120)
alive = [pid for pid in first_start["children"] if os.path.exists(f"/proc/{pid}")]
ray.shutdown()
print(json.dumps({"answer": answer, "first_children": first_start["children"], "alive": alive}))
"""


def test_a_local_ray_that_did_not_start_in_time_is_started_again_without_its_leftovers():
    environment = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}
    run = subprocess.run([sys.executable, "-c", PROBE], env=environment, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["answer"] == 42
    assert len(result["first_children"]) >= 2  # at least the GCS and the raylet
    assert result["alive"] == []  # every process of the failed start was stopped
    warnings = [line for line in run.stderr.splitlines() if "did not start in time" in line]
    assert len(warnings) == 1, run.stderr[-3000:]
    assert "timed out during startup" in warnings[0]
    assert f"its {len(result['first_children'])} processes stopped" in warnings[0]
