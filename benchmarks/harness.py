"""What several benchmarks share: their item counts read from the command line and the local Ray
(or the joined cluster) they measure on."""
from __future__ import annotations

import argparse
import time
from collections.abc import Mapping

#: Every Ray worker of a benchmark runs one torch / OpenMP / MKL thread, as the pipeline's workers.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def parse_sizes(text: str) -> list[int]:
    """Item counts from a command line, comma-separated, scientific notation accepted:
    ``"1e5,1e6, 2000"`` → ``[2000, 100000, 1000000]`` (ascending, each once); an
    ``argparse.ArgumentTypeError`` for anything else (empty, not a number, below 1)."""
    try:
        values = {int(float(part)) for part in text.split(",") if part.strip()}
    except ValueError:
        values = set()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive item counts separated by commas (1e5,1e6), got {text!r}")
    return sorted(values)


def start_ray(num_cpus: int = 2, *, address: str | None = None, env_vars: Mapping[str, str] | None = None,
              ray_data: bool = False) -> float:
    """Start a local Ray with ``num_cpus`` CPUs (a new instance even when another Ray runs on this
    machine, as the pipeline starts its own), or join the cluster at ``address``; every worker gets
    ``ONE_THREAD`` and ``env_vars``. ``ray_data``: the benchmark runs Ray Data, whose progress bars
    are turned off (importing ``ray.data`` is left out of the others' start-up time).
    Returns the seconds it took."""
    import ray

    from orchestrator.distributed.runtime import start_local_ray

    started = time.perf_counter()
    runtime_env = {"env_vars": {**ONE_THREAD, **(env_vars or {})}}
    if address is None:
        start_local_ray(num_cpus=num_cpus, runtime_env=runtime_env)
    else:
        ray.init(address=address, log_to_driver=False, runtime_env=runtime_env)
    if ray_data:
        import ray.data

        ray.data.DataContext.get_current().enable_progress_bars = False
    return time.perf_counter() - started
