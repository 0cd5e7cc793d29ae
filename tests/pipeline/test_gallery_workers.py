"""The gallery step on Ray workers (``GalleryExecutor`` → ``distributed.shard_workers``): no item
reaches the driver (it consumes no Ray Data dataset and receives a few hundred bytes per shard
update, whatever the shard's size), and a worker SIGKILLed in the middle of an update is replaced:
the update runs again as a new attempt of its step, and every item ends in exactly one shard."""
from __future__ import annotations

import os
import pickle
import signal
import sys

import numpy as np
import pyarrow as pa
import pytest
import ray
import torch
from ray import cloudpickle

from orchestrator.distributed import shard_workers
from local_ray import start_local_ray
from streamed_gallery import first_generation, served_rows

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ray_here():
    start_local_ray()
    yield
    ray.shutdown()


def no_items(value) -> bool:
    """Whether ``value`` holds only scalars, strings and containers of them (no array, no bytes)."""
    if isinstance(value, (np.ndarray, pa.Table, pa.Array, bytes, torch.Tensor)):
        return False
    if isinstance(value, dict):
        return all(no_items(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(no_items(v) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        return all(no_items(getattr(value, name)) for name in value.__dataclass_fields__)
    return isinstance(value, (str, int, float, bool, type(None)))


def test_the_driver_receives_metadata_only(ray_here, tmp_path, monkeypatch):
    received: list[int] = []
    real_get = ray.get

    def counting_get(refs, *args, **kwargs):
        value = real_get(refs, *args, **kwargs)
        received.append(len(pickle.dumps(value)))
        return value

    def refused(*args, **kwargs):
        raise AssertionError("the driver consumed a Ray Data dataset")

    monkeypatch.setattr(ray, "get", counting_get)
    for name in ("iter_batches", "iter_rows", "take", "take_all", "to_pandas"):
        monkeypatch.setattr(ray.data.Dataset, name, refused)
    for items_per_shard, folder in ((30, "small"), (270, "large")):
        config, store, updater = first_generation(tmp_path / folder, items_per_shard)
        received.clear()
        results = updater.execute(updater.committed_plan("g0-old"), "g0-old")
        assert len(results) == len(store.shards("photos")) == -(-539 // items_per_shard)
        assert all(no_items(result) for result in results)
        assert np.array_equal(np.sort(served_rows(store)), np.arange(539))
        # what the driver received: per shard update, not per item (30 or 270 items a shard alike)
        assert len(received) == len(results) and max(received) < 2000, received
        store.close()


class KillOnce:
    """A shard update's reader that SIGKILLs the worker process running it the first time (a marker
    file says it happened), then reads as ``inner`` does: a worker lost in the middle of an update."""

    def __init__(self, inner, marker: str):
        self.inner, self.marker = inner, marker

    def __call__(self):
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return self.inner()
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_mid_update_is_replaced_and_every_item_lands_once(ray_here, tmp_path, monkeypatch):
    config, store, updater = first_generation(tmp_path, items_per_shard=100)
    marker = str(tmp_path / "killed")
    real_reader = shard_workers.entry_reader

    def reader(source, source_ref, read, block_rows):
        inner = real_reader(source, source_ref, read, block_rows)
        return KillOnce(inner, marker) if read.entry == 2 else inner

    monkeypatch.setattr(shard_workers, "entry_reader", reader)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # KillOnce reaches workers by value
    results = updater.execute(updater.committed_plan("g0-old"), "g0-old")
    assert os.path.exists(marker)  # the kill happened
    assert sorted(r.key for r in results) == sorted(f"embed:photos/{k}:g0-old" for k in range(6))
    assert np.array_equal(np.sort(served_rows(store)), np.arange(539))  # every item, once
    attempts = {s.key: s.attempts for s in store.steps("embed:photos/")}
    assert attempts.pop("embed:photos/2:g0-old") == 2  # its update ran again, as a second attempt
    assert set(attempts.values()) <= {1, 2}  # a queued update of the lost worker may run again too
    assert {s.status for s in store.steps("embed:photos/")} == {"committed"}
    store.close()
