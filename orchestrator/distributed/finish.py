"""The gallery step's finish stage: once the staged parts of a shard update hold all its items, one of
the step's finisher actors reads them and writes the update's Parquet file and FAISS index
(``shard_update.finish_shard_update``), returning a ``ShardUpdateResult`` of about a kilobyte for
the driver to commit.

Kept apart from the Ray Data stages (``gallery_step``): the module a Ray actor's class lives in is
imported by its worker process, so a finisher imports what it runs (Ray's core, pyarrow, FAISS and,
through the geometry of the index, torch) and not Ray Data and pandas, which the embedding stages
need (about 1 s of a core less per finisher process, two or more of them per run).
"""
from __future__ import annotations

import importlib
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

from orchestrator.distributed.generation_model import GenerationModel
from orchestrator.distributed.task_errors import raised_error
from orchestrator.gc_startup import startup_phase
from orchestrator.shard_update.files import ShardTarget
from orchestrator.shard_update.parts import read_parts
from orchestrator.shard_update.update import ShardUpdate
from orchestrator.shard_update.work import ShardUpdateResult, finish_shard_update


def finish_task(update: ShardUpdate, part_uris: list[str], model: GenerationModel,
                target: ShardTarget) -> ShardUpdateResult:
    """What a finisher runs: the staged parts of ``update`` → its shard files (``finish_shard_update``)."""
    import ray

    node = f"{socket.gethostname()}:{ray.get_runtime_context().get_node_id()[:12]}:{os.getpid()}"
    return finish_shard_update(update, read_parts(part_uris, target.storage_options), model.name, model.space,
                               model.curv, target, node=node)


class Finisher:
    """A Ray actor (no CPU asked) that runs ``finish`` (``finish_task``, or a test's stand-in passed
    by value) for one update after another. It lives for the step: a task per update would start
    a worker process per update beyond the node's CPU count, each importing torch, pyarrow and
    FAISS again (measured: ~3 s of a busy core per update, taken from the embedding actors)."""

    def __init__(self, finish: Callable[..., ShardUpdateResult]):
        self.finish = finish
        # the index builder, which the shard store imports on first use (FAISS, and torch through
        # the geometry), loaded as the actor starts, beside the embedding actors loading their
        # model, and not inside the step's first finish (measured: 1.5-2.5 s of a core there)
        with startup_phase():
            importlib.import_module("orchestrator.index.factory")

    def run(self, update: ShardUpdate, part_uris: list[str], model: GenerationModel,
            target: ShardTarget) -> ShardUpdateResult:
        return self.finish(update, part_uris, model, target)


class Finishes:
    """The finish calls of the updates whose parts are complete, on ``at_once`` finisher actors
    (the rest wait in order); a call lost with its actor is handed to ``on_lost`` and the actor
    replaced. The actors start with the step, warm by the first finish, each on the next live node
    that offers CPUs (``NodeAffinitySchedulingStrategy``; Ray's ``SPREAD`` put two of them on one
    node of three in one try of three, and a soft affinity moved them off a node whose CPUs the
    embedding actors held: measured), and take turns: an update goes to the actor idle longest, so
    a step whose finishes come one at a time still writes its shards on every finisher's node, not
    all on the first one's. A step that ends well leaves its actors idle for the driver's next step
    (``_KEPT_FINISHERS``): each new one is a Python interpreter importing torch, pyarrow and FAISS
    (about 3 s of a core measured while it imported Ray Data too), and a run of three generations
    would start six of them."""

    def __init__(self, model: GenerationModel, target: ShardTarget, at_once: int,
                 on_lost: Callable[[ShardUpdate, BaseException], ShardUpdate | None]):
        self.model, self.target, self.at_once, self.on_lost = model, target, at_once, on_lost
        self.started, self.kept_as = 0, _kept_key()
        kept = _KEPT_FINISHERS.pop(self.kept_as, [])
        self.idle: list[Any] = kept + [self._new_actor() for _ in range(at_once - len(kept))]
        self.running: dict[Any, tuple[Any, ShardUpdate, list[str]]] = {}
        self.waiting: list[tuple[ShardUpdate, list[str]]] = []

    def __bool__(self) -> bool:
        return bool(self.running or self.waiting)

    def add(self, update: ShardUpdate, part_uris: list[str]) -> None:
        self.waiting.append((update, part_uris))
        self._start()

    def _actor(self):
        return self.idle.pop(0) if self.idle else self._new_actor()

    def _new_actor(self):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = _nodes_with_cpus()  # asked again for a replacement: a lost actor's node may be gone
        node = nodes[self.started % len(nodes)] if nodes else None
        self.started += 1
        strategy = "SPREAD" if node is None else NodeAffinitySchedulingStrategy(node, soft=False)
        return (ray.remote(Finisher).options(num_cpus=0, max_restarts=0, max_task_retries=0,
                                             scheduling_strategy=strategy).remote(finish_task))

    def _start(self) -> None:
        while self.waiting and len(self.running) < self.at_once:
            update, part_uris = self.waiting.pop(0)
            actor = self._actor()
            self.running[actor.run.remote(update, part_uris, self.model, self.target)] = (actor, update, part_uris)

    def completed(self, timeout: float | None) -> Iterator[ShardUpdateResult]:
        """The results of the finish calls done within ``timeout`` seconds (None: at least one)."""
        import ray

        if self.running:
            ready, _ = ray.wait(list(self.running), num_returns=1 if timeout is None else len(self.running),
                                timeout=timeout)
            for ref in ready:
                actor, update, part_uris = self.running.pop(ref)
                try:
                    result = _result(ref)
                except _Lost as lost:
                    ray.kill(actor)
                    again = self.on_lost(update, lost.error)
                    if again is None:
                        raise lost.error from None
                    self.waiting.insert(0, (again, part_uris))
                else:
                    self.idle.append(actor)
                    yield result
        self._start()

    def close(self) -> None:
        """Keep the idle finisher actors for the driver's next step; end those still running (the
        step failed: their calls' outcome is unknown)."""
        import ray

        for actor, _update, _uris in self.running.values():
            ray.kill(actor)
        _KEPT_FINISHERS.setdefault(self.kept_as, []).extend(self.idle)
        self.idle, self.running = [], {}


#: Idle finisher actors a step left for the next, by (Ray session, job, finish function): a new
#: cluster or driver starts afresh, and a test's stand-in ``finish_task`` gets actors of its own.
_KEPT_FINISHERS: dict[tuple[str, str, Callable[..., ShardUpdateResult]], list[Any]] = {}


def _kept_key() -> tuple[str, str, Callable[..., ShardUpdateResult]]:
    import ray

    context = ray.get_runtime_context()
    return context.get_session_name(), context.get_job_id(), finish_task


def _nodes_with_cpus() -> list[str]:
    """The ids of the live nodes that offer CPUs (a head started with ``--num-cpus=0`` runs no
    finisher), in Ray's order."""
    import ray

    return [node["NodeID"] for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) > 0]


class _Lost(Exception):
    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def _result(ref) -> ShardUpdateResult:
    """The finish call's result; its own error as raised on the worker; ``_Lost`` when its actor was."""
    import ray
    from ray.exceptions import RayError, RayTaskError

    try:
        return ray.get(ref)
    except RayTaskError as failed:
        cause = raised_error(failed)
        if cause is failed:
            raise
        raise cause from failed
    except RayError as lost:
        raise _Lost(lost) from lost
