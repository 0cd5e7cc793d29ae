"""A process's start-up without the cyclic garbage collector walking its imports again and again.

Importing torch, timm, Ray Data or FAISS creates a few hundred thousand objects that live as long
as the process. CPython's cyclic collector runs on allocation counts (a young-generation pass every
700 net allocations, an older one every 10 of those, a full one when the objects that survived grew
by a quarter), so while they load, and then while the process works, its passes walk them again
and again. ``startup_phase`` pauses the collector around what a process does once as it starts,
collects once at the end, and freezes what is left alive (``gc.freeze``: moved to the collector's
permanent generation, never walked again; reference counting still frees each object when its
last reference goes).

Measured (2026-12-05, an idle 2-core Intel Xeon, CPython 3.11, the CPU of every process of one
`orchestrator run` of the tests' one-generation pipeline, two or three runs each): 22.3-22.5
core-s before, 19.0-19.2 with ``startup_phase`` around the driver's imports of the runner, the
embedding actors' model load and the finishers' index layer (driver 9.3-9.5 → 7.3-7.8 s,
embedding actor 5.2-5.3 → 4.0 s, finisher 2.2 → 1.9-2.0 s); 18.1-18.4 without the final collection, which is kept so
that no reference cycle made during start-up outlives it.

What it costs: an object alive when the phase ends that later becomes part of an unreachable
cycle is never freed, nor finalized at exit. At a process's start that is the modules, the model
and the process's own settings; so the phase is for a process's start only, never the middle of
its work (Ray Train's local mode runs a training in the driver: a phase there froze the run's
open lineage connection, and SQLite's write-ahead log outlived the run). A long-lived process (a
test session) that enters it several times keeps more.
"""
from __future__ import annotations

import gc
import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def startup_phase() -> Iterator[None]:
    """Inside: the cyclic collector paused. At the end: one collection, what survives frozen, the
    collector enabled again. A block entered while the collector is off (nested, or a caller's own
    ``gc.disable()``) changes nothing."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


def start_worker_process(modules: tuple[str, ...], torch_threads: int,
                         environment: dict[str, str] | None = None) -> None:
    """Initializer of a pool's worker process (``ProcessPoolExecutor(initializer=…)``), kept in
    this light module because a spawned process unpickles its initializer before anything else:
    torch limited to ``torch_threads`` threads, and ``modules`` (those whose functions its tasks
    call) imported inside the start-up phase rather than while its first task is unpickled.
    ``environment``: the parent's environment when the pool started, for a worker forked from a
    fork server that started earlier (its own environment is the parent's at that time)."""
    if environment is not None:
        os.environ.clear()
        os.environ.update(environment)
    with startup_phase():
        import torch

        torch.set_num_threads(torch_threads)
        for module in modules:
            importlib.import_module(module)
