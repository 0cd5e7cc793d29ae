"""``startup_phase``: the cyclic collector paused inside, one collection at the end (a cycle made
and dropped inside is freed), what survives frozen, the collector's state left as the caller had it;
``start_worker_process`` as a spawned process's initializer."""
from __future__ import annotations

import gc
import multiprocessing
import weakref
from concurrent.futures import ProcessPoolExecutor

import pytest

from orchestrator.gc_startup import start_worker_process, startup_phase


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def collector_on():
    """The collector enabled after the test whatever it did. What a test froze stays frozen, as
    the suite's own collection phase froze what was alive then (``gc.unfreeze`` would undo that too)."""
    yield
    gc.enable()


def _in_a_collected_generation(obj: object) -> bool:
    """Whether ``obj`` is in one of the collector's generations 0-2, rather than frozen. (Counting
    the frozen objects would not do: another thread of the test process may free frozen objects
    meanwhile, and the count falls.)"""
    return any(other is obj for generation in range(3) for other in gc.get_objects(generation))


def test_inside_paused_after_collected_and_frozen(collector_on):
    with startup_phase():
        assert not gc.isenabled()
        dropped, kept = Node(), Node()
        dropped.other, kept.other = dropped, kept  # two self-cycles: one dropped, one kept
        dead = weakref.ref(dropped)
        del dropped
        assert dead() is not None  # no pass ran inside
    assert gc.isenabled()
    assert dead() is None  # the end's collection freed the dropped cycle
    assert gc.is_tracked(kept) and not _in_a_collected_generation(kept)  # frozen: in none of 0-2
    assert kept.other is kept


def test_a_caller_that_turned_the_collector_off_keeps_it_off_and_nothing_is_frozen(collector_on):
    gc.disable()
    with startup_phase():
        made_inside = Node()
    assert not gc.isenabled()
    assert any(other is made_inside for other in gc.get_objects(generation=0))  # not collected, not frozen


def _worker_state() -> tuple[int, bool, int, bool]:
    import sys

    import torch

    return torch.get_num_threads(), gc.isenabled(), gc.get_freeze_count(), "json.tool" in sys.modules


def test_a_spawned_worker_starts_with_its_modules_imported_and_frozen():
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=start_worker_process,
                             initargs=(("json.tool",), 1)) as pool:
        threads, enabled, frozen, imported = pool.submit(_worker_state).result(timeout=120)
    assert (threads, enabled, imported) == (1, True, True)
    assert frozen > 10_000  # torch's objects, at least
