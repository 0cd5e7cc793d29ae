"""The first answers: CPU seconds and peak memory of commands that only validate or refuse.

Each case runs ``python -m orchestrator ...`` in a fresh process (the user's experience: a new
interpreter, nothing imported) with the package taken from each source tree given
(its working directory and ``PYTHONPATH``; the pipeline file is each tree's own), one after the other, ``--repeat``
times; CPU is user + system seconds of the
child and its children (``resource.getrusage(RUSAGE_CHILDREN)`` before and after), memory the
child's peak resident set (``ru_maxrss`` of ``os.wait4``). The table shows the median of the
repeats per tree and the ratio of the first tree to the last (e.g. ``--trees /work/main .``: the
version before issue 26 against this one).

The cases: a pipeline file with a missing field, a method parameter out of range, ``lineage``
of a storage that holds no lineage store (a valid file; the timm name cache warm), ``verify`` of
a file that does not exist, ``schema`` and ``--help``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PIPELINE = "pipelines/lifelong.yaml"


@dataclass(frozen=True)
class Measurement:
    """One run of one case: exit status, CPU seconds (user + system), peak RSS in MB, wall seconds."""

    status: int
    cpu_s: float
    peak_mb: float
    wall_s: float


def cases(scratch: Path) -> dict[str, list[str]]:
    """Case name → the ``orchestrator`` arguments (files under ``scratch``)."""
    bad = scratch / "missing-field.yaml"
    bad.write_text("name: x\ngenerations: []\n")
    missing = scratch / "no-store"
    return {
        "config error (data: Field required)": ["run", str(bad)],
        "method parameter out of range": ["run", PIPELINE, "--set", "generations.1.method.params.lam=-1"],
        "lineage of a missing store": ["lineage", PIPELINE, "--storage", str(missing)],
        "verify of a missing file": ["verify", str(scratch / "nothing.yaml")],
        "schema": ["schema"],
        "--help": ["--help"],
    }


def measure(argv: list[str], tree: Path) -> Measurement:
    """Run ``python -m orchestrator argv`` in ``tree`` (its working directory and ``PYTHONPATH``)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "orchestrator", *argv], env=env, cwd=tree,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    return Measurement(process.returncode, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, wall)


def run(trees: list[Path], repeat: int) -> dict[str, dict[str, list[Measurement]]]:
    """Every case on every tree, ``repeat`` times, interleaved (so load changes hit all alike)."""
    results: dict[str, dict[str, list[Measurement]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, argv in cases(Path(scratch)).items():
            results[name] = {str(tree): [] for tree in trees}
            for _ in range(repeat):
                for tree in trees:
                    results[name][str(tree)].append(measure(argv, tree))
    return results


def format_table(results: dict[str, dict[str, list[Measurement]]]) -> str:
    """A Markdown table: per case and tree the median CPU s and peak MB, and first/last ratios."""
    trees = list(next(iter(results.values())))
    header = "| case | " + " | ".join(f"{t}: CPU s, peak MB" for t in trees) + " | CPU ratio | memory ratio |"
    lines = [header, "|---" * (len(trees) + 3) + "|"]
    for name, per_tree in results.items():
        cpu = [statistics.median(m.cpu_s for m in per_tree[t]) for t in trees]
        mb = [statistics.median(m.peak_mb for m in per_tree[t]) for t in trees]
        cells = " | ".join(f"{c:.2f} s, {m:.0f} MB" for c, m in zip(cpu, mb))
        lines.append(f"| {name} | {cells} | {cpu[0] / cpu[-1]:.1f}× | {mb[0] / mb[-1]:.1f}× |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs="+", type=Path, default=[Path(".")],
                        help="source trees to compare (PYTHONPATH of each run), e.g. /work/main .")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case per tree (the median is shown)")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    args = parser.parse_args(argv)
    results = run([tree.resolve() for tree in args.trees], args.repeat)
    print(format_table(results))
    if args.json:
        args.json.write_text(json.dumps({name: {tree: [asdict(m) for m in runs] for tree, runs in per_tree.items()}
                                         for name, per_tree in results.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
