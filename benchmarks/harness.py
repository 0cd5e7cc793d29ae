"""What several benchmarks share: their item counts read from the command line, the local Ray
(or the joined cluster) they measure on, the commit they measured, the results file they write and
the generated README section they rewrite."""
from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The checkout the benchmarks run from (the folder holding ``benchmarks/`` and ``orchestrator/``).
CHECKOUT = Path(__file__).resolve().parents[1]

#: Every Ray worker of a benchmark runs one torch / OpenMP / MKL thread, as the pipeline's workers.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

#: The process title of Ray Data's coordinator actor, which runs the gallery step's executor.
COORDINATOR_TITLE = "ray::SplitCoordinator"


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


def checkout_commit(watched: tuple[str, ...] = ("orchestrator",), checkout: Path = CHECKOUT) -> str:
    """The short commit of ``checkout``, with "+dirty" when any of the ``watched`` paths (relative to
    it) differ from that commit; "?" outside a git checkout."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True)
    if head.returncode != 0:
        return "?"
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *watched], cwd=checkout).returncode != 0
    return head.stdout.strip() + ("+dirty" if dirty else "")


def replace_section(text: str, section: str, begin: str, end: str) -> str:
    """``text`` with what lies between the markers ``begin`` and ``end`` (both included) replaced by
    ``section``; a ``ValueError`` naming the markers when ``text`` does not hold them in that order."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"no generated section ({begin} … {end}) to replace")
    return text[:start] + section + text[stop + len(end):]


def rewrite_section(readme: Path, section: str, begin: str, end: str) -> None:
    """The file ``readme`` with its generated section (``replace_section``) replaced by ``section``."""
    readme.write_text(replace_section(readme.read_text(encoding="utf-8"), section, begin, end), encoding="utf-8")


def write_results(path: Path, document: Any, lead: str = "") -> None:
    """``document`` as indented JSON to ``path`` (its folder made), and a line saying where
    (``lead`` printed before it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"{lead}results written to {path}")


class ProcessCpu:
    """The CPU time (user + system, seconds) of the process on this machine whose title starts with
    ``title`` (a Ray actor's: ``ray::SplitCoordinator``) and that did not exist when this object
    was made, as last read: ``read()`` finds it the first time it exists and re-reads its counters
    (one /proc read, ~50 µs). ``cpu_s``: all its CPU until the last read (its start-up included);
    ``window()``: its CPU and the wall seconds from the first read to the last (start-up left
    out). Reads stop counting when it ends, so call ``read`` as often as it may end."""

    def __init__(self, title: str) -> None:
        self.title, self.process, self.cpu_s = title, None, 0.0
        self.first: tuple[float, float] | None = None  # (wall clock, cpu_s) at the first read that found it
        self.last_at = 0.0
        self.earlier = {p.pid for p in self._titled()}

    def _titled(self) -> list:
        import psutil

        return [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0].startswith(self.title)]

    def read(self) -> float:
        import psutil

        try:
            if self.process is None:
                self.process = next((p for p in self._titled() if p.pid not in self.earlier), None)
            if self.process is not None:
                times = self.process.cpu_times()
                self.cpu_s, self.last_at = times.user + times.system, time.perf_counter()
                if self.first is None:
                    self.first = (self.last_at, self.cpu_s)
        except psutil.NoSuchProcess:
            pass
        return self.cpu_s

    def window(self) -> tuple[float, float]:
        """(CPU seconds, wall seconds) between the first and the last read; (0, 0) before two."""
        if self.first is None:
            return 0.0, 0.0
        return self.cpu_s - self.first[1], self.last_at - self.first[0]
