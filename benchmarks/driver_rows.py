"""The gallery step's driver at scale: what a staged part's row costs it, and how many rows a second
it can take.

    python benchmarks/driver_rows.py [--rows 400,2000] [--idle-seconds 20] [--json out.json]

The step's driver receives one metadata row per staged part (``gallery_step.run_shard_updates``:
entry, URI, item count) and commits one lineage step per shard update. A part is what one actor
call embedded: one read task's rows (at most ``TASK_BLOCKS`` blocks; Ray Data merges the blocks a
read task yields into one while they stay under its target block size, 128 MiB, so a task of the
step's ``TASK_BLOCKS`` × 2,048 rows is one call and one part). On a cluster of many nodes the rows
arrive as fast as the actors embed, so the driver's CPU per row decides how many parts a second
one driver can take. Measured here on a pipeline of the step's shape whose actors do no work:

  rows    read tasks of one one-row block, fused into a pool of 2 one-CPU actors (the step's
          ``ActorPoolStrategy``) that return one row per call, iterated by the driver as the step
          iterates its part rows (``gallery_step._batches``: Ray Data's executor in its
          coordinator actor, ``streaming_split(1)``; the row's columns to Python): the rows arrive
          as fast as Ray Data delivers them. Two counts give the driver's marginal CPU (user +
          system) per row (a task dispatched, its output received) and the rows per second it
          took; on this machine the actors and Ray share the driver's two cores, so the rate is a
          floor.
  idle    the same pipeline whose actors sleep ``--block-sleep`` per call: the driver's CPU per
          second of a step whose rows come slowly (Ray Data's executor loop and its iterator's
          10 ms wait, which run whatever the rows).

Each shape runs twice, side by side: ``coordinator`` (the step's way from
``config.gallery.COORDINATOR_FROM_ITEMS`` items, above) and ``driver`` (Ray Data's executor in the
driver, ``Dataset.iter_batches``: the step's way below it, and for every step before 2026-12-06).
For the coordinator runs the coordinator actor's own CPU is read from /proc when its iteration
ends (``coordinator_cpu_s``): the executor's work moved, not removed.

The shard-update commits are measured inside the real step by ``gallery_scale.py``
(``commit_ms_per_update``). Results beside the step's figures in benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/driver_rows.py`: the checkout on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa

from benchmarks.harness import COORDINATOR_TITLE, ProcessCpu, checkout_commit, parse_sizes, start_ray, write_results
from orchestrator.distributed.gallery_step import TASK_BLOCKS

PAYLOAD_BYTES = 2048  # per row of the read: above TARGET_BLOCK_BYTES, so no two rows merge
TARGET_BLOCK_BYTES = 1024
EXECUTORS = ("coordinator", "driver")


def driver_cpu_s() -> float:
    """This process's CPU time so far (user + system), seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class PartRows:
    """The actors' stage: a block in, one (entry, uri, n_items) row out, after ``sleep_s``."""

    def __init__(self, sleep_s: float):
        self.sleep_s = sleep_s

    def __call__(self, block: pa.Table) -> pa.Table:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        entry = block.column("entry")[0].as_py()
        return pa.table({"entry": [entry], "uri": [f"parts/{entry}/{block.column('row')[0].as_py():012d}.arrow"],
                         "n_items": [2048]})


def rows_dataset(rows: int, sleep_s: float, blocks_per_task: int = 1):
    """``rows`` one-row blocks in read tasks of ``blocks_per_task`` blocks, through 2 ``PartRows``
    actors; with several blocks per task each block stays a block of its own (a payload above
    the target block size, which ``drive`` sets to 1 KiB: what 128 MiB does to a task of large
    images), so each is one call and one row."""
    import ray.data
    from ray.data import ActorPoolStrategy, Datasource, ReadTask
    from ray.data.block import BlockMetadata

    def blocks(first: int, count: int):
        for row in range(first, first + count):
            yield pa.table({"entry": [row // 2], "row": [row], "payload": [bytes(PAYLOAD_BYTES)]})

    class Blocks(Datasource):
        def estimate_inmemory_data_size(self) -> int | None:
            return None

        def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context=None):
            return [ReadTask(lambda first=first: blocks(first, min(blocks_per_task, rows - first)),
                             BlockMetadata(num_rows=min(blocks_per_task, rows - first), size_bytes=None,
                                           exec_stats=None, input_files=None))
                    for first in range(0, rows, blocks_per_task)]

    tasks = -(-rows // blocks_per_task)
    return ray.data.read_datasource(Blocks(), override_num_blocks=tasks).map_batches(
        PartRows, fn_constructor_kwargs={"sleep_s": sleep_s}, compute=ActorPoolStrategy(min_size=2, max_size=2),
        batch_size=None, batch_format="pyarrow", num_cpus=1)


def drive(rows: int, sleep_s: float = 0.0, blocks_per_task: int = 1, executor: str = "coordinator") -> dict[str, Any]:
    """Iterate ``rows`` part rows as the step's driver does (``rows_dataset`` through
    ``gallery_step._batches``, Ray Data's executor in its coordinator actor or in the driver); its
    CPU and wall time for them, and for a coordinator its actor's CPU (``ProcessCpu``, read at
    each row and once after the iteration: all of it, and from its first row to its last)."""
    import ray.data

    from orchestrator.distributed.gallery_step import _batches

    seen: dict[int, dict[str, int]] = {}
    coordinator = ProcessCpu(COORDINATOR_TITLE)
    context = ray.data.DataContext.get_current()
    kept = context.target_max_block_size
    if blocks_per_task > 1:
        context.target_max_block_size = TARGET_BLOCK_BYTES
    try:
        dataset = rows_dataset(rows, sleep_s, blocks_per_task)
        batches = _batches(dataset, executor)
        cpu, started = driver_cpu_s(), time.perf_counter()
        for batch in batches:
            for entry, uri, n_items in zip(*(batch.column(c).to_pylist() for c in ("entry", "uri", "n_items"))):
                seen.setdefault(entry, {})[uri] = n_items
            if executor == "coordinator":
                coordinator.read()
        wall, spent = time.perf_counter() - started, driver_cpu_s() - cpu
        if executor == "coordinator":
            coordinator.read()
    finally:
        context.target_max_block_size = kept
    received = sum(len(parts) for parts in seen.values())
    if received != rows:
        raise RuntimeError(f"the driver received {received} part rows, {rows} were staged")
    return {"rows": rows, "blocks_per_task": blocks_per_task, "block_sleep_s": sleep_s, "executor": executor,
            "wall_s": wall, "driver_cpu_s": spent,
            "coordinator_cpu_s": coordinator.cpu_s if executor == "coordinator" else None,
            "coordinator_window_s": coordinator.window() if executor == "coordinator" else None}


def marginal(small: dict[str, Any], large: dict[str, Any]) -> dict[str, float | None]:
    """Between two runs of one shape: the driver's (and the coordinator's) CPU per added row, ms,
    and the rows a second the larger run took."""
    added = large["rows"] - small["rows"]
    coordinator = None if large["coordinator_cpu_s"] is None else \
        (large["coordinator_cpu_s"] - small["coordinator_cpu_s"]) / added * 1e3
    return {"driver_ms_per_row": (large["driver_cpu_s"] - small["driver_cpu_s"]) / added * 1e3,
            "coordinator_ms_per_row": coordinator, "rows_per_s": large["rows"] / large["wall_s"]}


def per_second(idle: dict[str, Any]) -> dict[str, float | None]:
    """An idle run's driver (and coordinator) CPU per second of it, ms, and its rows a second."""
    window = idle["coordinator_window_s"]  # from its first row to its last: its start-up left out
    coordinator = None if window is None or not window[1] else window[0] / window[1] * 1e3
    return {"idle_driver_ms_per_s": idle["driver_cpu_s"] / idle["wall_s"] * 1e3,
            "idle_coordinator_ms_per_s": coordinator, "idle_rows_per_s": idle["rows"] / idle["wall_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=parse_sizes, default=[400, 2000], help="part rows per run (two or more)")
    parser.add_argument("--blocks-per-task", type=parse_sizes, default=[1, TASK_BLOCKS],
                        help="read tasks' shapes: blocks (calls, rows) per task")
    parser.add_argument("--block-sleep", type=float, default=0.25, help="seconds an idle run's actors sleep per call")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="about how long the idle run lasts")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if len(args.rows) < 2:
        parser.error("--rows needs two counts or more (the marginal cost per row is their difference)")
    start_ray(2, ray_data=True)
    for executor in EXECUTORS:  # Ray Data's own actors and the first actor pool start here, not in a measured run
        drive(min(100, args.rows[0]), executor=executor)
    runs, summary = [], {}
    for executor in EXECUTORS:
        shapes = {}
        for blocks_per_task in args.blocks_per_task:
            measured = [drive(rows, blocks_per_task=blocks_per_task, executor=executor) for rows in args.rows]
            runs += measured
            shapes[blocks_per_task] = marginal(measured[0], measured[-1])
        idle = drive(max(2, round(args.idle_seconds / args.block_sleep * 2)), args.block_sleep, executor=executor)
        runs.append(idle)  # two actors sleep at once
        summary[executor] = {"by_blocks_per_task": shapes, **per_second(idle)}
    for run in runs:
        print(f"{run['executor']:>11}: {run['rows']:>5} rows, {run['blocks_per_task']:>3} a task, actors sleeping "
              f"{run['block_sleep_s']:.2f} s a call: {run['wall_s']:6.1f} s, driver CPU {run['driver_cpu_s']:.2f} s "
              f"({run['driver_cpu_s'] / run['rows'] * 1e3:.2f} ms a row)"
              + ("" if run["coordinator_cpu_s"] is None else f", coordinator CPU {run['coordinator_cpu_s']:.2f} s"))
    for executor, figures in summary.items():
        for blocks_per_task, shape in figures["by_blocks_per_task"].items():
            print(f"executor in the {executor}, tasks of {blocks_per_task} row(s): {shape['driver_ms_per_row']:.2f} ms of "
                  f"driver CPU per added row, {shape['rows_per_s']:.0f} rows/s taken"
                  + ("" if shape["coordinator_ms_per_row"] is None else
                     f"; the coordinator {shape['coordinator_ms_per_row']:.2f} ms per added row"))
        print(f"executor in the {executor}, idle: {figures['idle_driver_ms_per_s']:.0f} ms of driver CPU per second "
              f"while rows come {figures['idle_rows_per_s']:.1f} a second"
              + ("" if figures["idle_coordinator_ms_per_s"] is None else
                 f"; the coordinator {figures['idle_coordinator_ms_per_s']:.0f} ms per second"))
    if args.json:
        write_results(args.json, {"commit": checkout_commit(), "runs": runs, "summary": summary,
                                  "config": {k: v for k, v in vars(args).items() if k != "json"}})
    import ray

    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
