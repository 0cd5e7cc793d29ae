"""Where an update experiment's trainer processes come from: spawned, or forked from a fork server.

``run_update_experiment(workers=N)`` trains in N processes. Spawned, each is a new interpreter that
imports torch, timm and the methods (about 4 s of a core); forked from the process's fork server
(``update_experiment._trainer_context``, the default), only the server imports them, once per
process, and every later experiment of that process forks from it. Each case here is a new Python
process that runs ``--experiments`` small two-process experiments in a row (bct and hbct on 160
digits, 1 epoch: the work is mostly the processes' start-up) with one start method; the cases
alternate, ``--repeat`` times. CPU is the whole machine's busy time over the case
(``/proc/stat``: the trainer processes are the fork server's children, not the case's), so run it
on otherwise idle cores; the table gives the median per start method and the ratio.

    python benchmarks/trainer_processes.py [--experiments 3] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

CASE = """
import multiprocessing, sys
import numpy as np
from orchestrator.data import load_digits
from orchestrator.evaluation import update_experiment as ue
from orchestrator.training.config import TrainConfig

def small():
    rng = np.random.default_rng(0)
    train, test = load_digits("train"), load_digits("test")
    return ue.UpdateExperiment(
        ue.ExperimentSettings(embed_dim=8, image_size=16,
                              training=TrainConfig(epochs=1, batch_size=32, lr=0.05, augment=False, seed=3)),
        train_images=train.subset(np.sort(rng.choice(len(train), 160, replace=False))),
        eval_images=test.subset(np.sort(rng.choice(len(test), 60, replace=False))))

if __name__ == "__main__":
    method, experiments = sys.argv[1], int(sys.argv[2])
    if method == "spawn":
        ue._trainer_context = lambda: multiprocessing.get_context("spawn")
    for _ in range(experiments):
        ue.run_update_experiment(["bct", "hbct"], experiment=small(), workers=2)
"""

METHODS = ("spawn", "forkserver")


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (not idle, not waiting on I/O) since boot."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def measure(method: str, experiments: int) -> tuple[float, float]:
    """(busy CPU seconds, wall seconds) of one case."""
    busy, started = busy_seconds(), time.perf_counter()
    subprocess.run([sys.executable, "-c", CASE, method, str(experiments)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return busy_seconds() - busy, time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    results: dict[str, list[tuple[float, float]]] = {method: [] for method in METHODS}
    for _ in range(args.repeat):
        for method in METHODS:
            results[method].append(measure(method, args.experiments))
    print(f"{args.experiments} two-process experiments in one process, median of {args.repeat}")
    print(f"{'trainers':<12}{'CPU s':>8}{'wall s':>8}")
    medians = {method: tuple(statistics.median(values) for values in zip(*runs)) for method, runs in results.items()}
    for method, (cpu, wall) in medians.items():
        print(f"{method:<12}{cpu:>8.1f}{wall:>8.1f}")
    print(f"forkserver / spawn: CPU {medians['forkserver'][0] / medians['spawn'][0]:.2f}, "
          f"wall {medians['forkserver'][1] / medians['spawn'][1]:.2f}")


if __name__ == "__main__":
    main()
