"""The gallery step on Ray Data (``GalleryExecutor`` → ``distributed.gallery_step``): no item
reaches the driver (it receives a few metadata rows per shard update and each update's result, a
few hundred bytes whatever the shard's size), and a worker SIGKILLed in the middle of an update,
in the embedding stage or while writing the update's files, costs no item and no copy: every item
ends in exactly one committed shard, and no staged part is left."""
from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
import ray.data
import torch
from ray import cloudpickle
from ray.exceptions import RayError

import streamed_gallery
from local_ray import start_local_ray
from orchestrator.config.gallery import EmbeddingSpec
from orchestrator.distributed import finish, gallery_step
from orchestrator.lineage.step_keys import StepKind, shard_update_key
from orchestrator.pipeline.verify import verify_storage
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


def arrays_in(value, depth: int = 0) -> list:
    """The Arrow tables and numpy arrays in ``value`` (lists, tuples, dicts, dataclasses, a few deep)."""
    if isinstance(value, (pa.Table, np.ndarray, pa.Array)):
        return [value]
    if depth > 4:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        value = list(vars(value).values())
    if isinstance(value, (list, tuple)):
        return [found for item in value for found in arrays_in(item, depth + 1)]
    return []


@pytest.mark.parametrize("executor", ["coordinator", "driver"])
def test_the_driver_receives_metadata_rows_only(ray_here, tmp_path, monkeypatch, request, executor):
    """Counted: every object the driver's ``ray.get`` returns (Ray Data's own bookkeeping
    included: block references and metadata from the coordinator actor, no table) and every row
    the step's dataset streams to it; and at each row, the driver's threads: Ray Data's executor
    (a ``StreamingExecutor-<dataset>`` thread where it runs) is not among them where the step
    runs it in the coordinator actor (``embedding.executor``), and is where it runs in the driver
    (seen while a step of 18 read tasks still dispatches them; a step of two may be done first).
    The 539 items are below ``COORDINATOR_FROM_ITEMS``: what ``auto`` runs in the driver.
    Also: the step's Ray Data settings (``gallery_step.STEP_SETTINGS``, the ``ray.data`` logger
    quiet) hold while its rows stream, and the driver's own are back after it (seen failing when
    the step set them for the whole process)."""
    assert EmbeddingSpec().executor_for(539) == "driver"
    data_context, ray_data_logger = ray.data.DataContext.get_current(), logging.getLogger("ray.data")
    monkeypatch.setattr(data_context, "raise_original_map_exception", False)  # the driver's own settings
    monkeypatch.setattr(data_context, "enable_progress_bars", True)
    level_before = ray_data_logger.level
    ray_data_logger.setLevel(logging.INFO)
    request.addfinalizer(lambda: ray_data_logger.setLevel(level_before))

    def settings() -> tuple[bool, bool, int]:
        return data_context.raise_original_map_exception, data_context.enable_progress_bars, ray_data_logger.level

    during: set[tuple[bool, bool, int]] = set()
    ours: list[int] = []  # the step's rows and results
    executors_here: set[str] = set()  # Ray Data executor threads seen in the driver
    schemas: set[tuple[str, ...]] = set()
    fetched: list = []  # every Arrow table or array the driver fetched
    real_get, real_batches = ray.get, gallery_step._batches

    def counting_get(refs, *args, **kwargs):
        value = real_get(refs, *args, **kwargs)
        fetched.extend(arrays_in(value))
        if isinstance(value, gallery_step.ShardUpdateResult):
            ours.append(len(pickle.dumps(value)))
        return value

    def counting_batches(dataset, executor_here):
        for batch in real_batches(dataset, executor_here):
            executors_here.update(t.name for t in threading.enumerate() if t.name.startswith("StreamingExecutor"))
            schemas.add(tuple(batch.column_names))
            during.add(settings())
            ours.append(len(pickle.dumps(batch.to_pylist())))  # the rows as plain values
            yield batch

    monkeypatch.setattr(ray, "get", counting_get)
    monkeypatch.setattr(gallery_step, "_batches", counting_batches)
    for items_per_shard, folder in ((30, "small"), (270, "large")):
        config, store, updater = first_generation(tmp_path / folder, items_per_shard, executor=executor)
        ours.clear()
        fetched.clear()
        executors_here.clear()
        during.clear()
        results = updater.executor.execute(updater.planner.committed_plan("g0-old"), "g0-old")
        assert during == {(True, False, logging.WARNING)} and settings() == (False, True, logging.INFO)
        assert len(results) == len(store.shards("photos")) == -(-539 // items_per_shard)
        assert all(no_items(result) for result in results)
        assert np.array_equal(np.sort(served_rows(store)), np.arange(539))
        # from the dataset: one small row per staged part, no array
        assert schemas == {("entry", "uri", "n_items")}
        if executor == "coordinator":
            assert not executors_here, executors_here
        elif items_per_shard == 30:  # 18 read tasks: the executor still dispatches when the first rows come
            assert executors_here
        assert sum(ours) / len(results) < 1500, ours  # the step's own: a result and a part row or two
        # no block of items or embeddings was fetched: the only tables are the part rows
        assert {tuple(t.column_names) if isinstance(t, pa.Table) else type(t).__name__ for t in fetched} <= \
            {("entry", "uri", "n_items")}, fetched[:3]
        assert not os.listdir(tmp_path / folder / "run" / "galleries" / "photos" / "staging")  # parts removed
        store.close()


@pytest.mark.parametrize("executor", ["coordinator", "driver"])
def test_an_undecodable_image_fails_the_step_with_the_stages_own_error(ray_here, tmp_path, monkeypatch, executor):
    """An error raised in the embedding stage (here: one gallery row whose bytes are no image)
    reaches the driver as the stage raised it, out of the wrappers it travels in (Ray's errors of
    the actor pool's task and, with the executor there, of Ray Data's coordinator actor), and
    nothing is committed. Seen failing before Ray Data was told to raise a stage's own error (its
    ``UserCodeException`` lost its cause on the way through the coordinator)."""
    write_gallery = streamed_gallery.write_parquet_gallery

    def with_one_broken_image(folder, labelled=False):
        expected = write_gallery(folder, labelled)
        file = folder / "part-002.parquet"
        table = pq.read_table(file)
        images = table.column("image").to_pylist()
        images[7] = b"no image here"
        pq.write_table(table.set_column(table.schema.get_field_index("image"), "image", pa.array(images)), file,
                       row_group_size=32)
        return expected

    monkeypatch.setattr(streamed_gallery, "write_parquet_gallery", with_one_broken_image)
    config, store, updater = first_generation(tmp_path, 270, executor=executor)
    with pytest.raises(ValueError, match="cannot decode") as raised:
        updater.executor.execute(updater.planner.committed_plan("g0-old"), "g0-old")
    assert not isinstance(raised.value, RayError), type(raised.value).__mro__  # not Ray's error "as instance of" it
    assert all(shard.embeddings_uri is None for shard in store.shards("photos"))
    store.close()


class ActorKiller(threading.Thread):
    """SIGKILLs one embedding actor's process (found by its Ray process title, among this process's
    descendants: this test's local Ray, never another lane's) as soon as the first part is staged
    under ``staging``: an actor lost in the middle of the step's updates."""

    def __init__(self, staging: Path):
        super().__init__(daemon=True)
        self.staging, self.killed, self.stop = staging, None, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and self.killed is None:
            if self.staging.exists() and any(self.staging.rglob("*.arrow")):
                for process in psutil.Process().children(recursive=True):
                    try:
                        if "MapBatches(EmbedAndStage)" in " ".join(process.cmdline()):
                            os.kill(process.pid, signal.SIGKILL)
                            self.killed = process.pid
                            return
                    except psutil.NoSuchProcess:
                        continue
            time.sleep(0.01)


def finish_killing_once(update, part_uris, model, target, marker):
    """``finish.finish_task``, SIGKILLing its process the first time it writes shard 3."""
    if update.shard == 3:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            os.kill(os.getpid(), signal.SIGKILL)
        except FileExistsError:
            pass
    return finish.finish_shard_update(update, finish.read_parts(part_uris, target.storage_options),
                                      model.name, model.space, model.curv, target, node=f"pid:{os.getpid()}")


def test_workers_killed_mid_update_cost_no_item_and_no_copy(ray_here, tmp_path, monkeypatch):
    config, store, updater = first_generation(tmp_path, items_per_shard=100, batch_size=4)
    finish_marker = str(tmp_path / "finish-killed")
    killer = ActorKiller(tmp_path / "run" / "galleries" / "photos" / "staging")
    killer.start()
    monkeypatch.setattr(finish, "finish_task",
                        lambda update, uris, model, target: finish_killing_once(update, uris, model, target,
                                                                                finish_marker))
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the finish killer reaches workers by value
    try:
        results = updater.executor.execute(updater.planner.committed_plan("g0-old"), "g0-old")
    finally:
        killer.stop.set()
    assert killer.killed is not None and os.path.exists(finish_marker)  # both kills happened
    assert sorted(r.key for r in results) == sorted(shard_update_key(StepKind.EMBED, "photos", k, "g0-old") for k in range(6))
    assert np.array_equal(np.sort(served_rows(store)), np.arange(539))  # every item, once
    attempts = {s.key: s.attempts for s in store.steps("embed:photos/")}
    assert attempts.pop("embed:photos/3:g0-old") == 2  # its files were written again, as a second attempt
    assert set(attempts.values()) == {1}  # Ray Data retried the lost embedding work inside the attempt
    assert {s.status for s in store.steps("embed:photos/")} == {"committed"}
    writers = {store.committed_outputs(s.key)["node"] for s in store.steps("embed:photos/")}
    # two embedding actors, so two finishers wrote all 6 updates, and one's replacement after its kill
    assert config.gallery.embedding.pool_size == (2, 2)
    assert len(writers) <= 3, writers
    verification = verify_storage(store, config.storage)
    assert verification.ok and verification.unreferenced == [], verification.lines()
    store.close()
