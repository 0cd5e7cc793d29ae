"""The gallery-scale benchmark's building blocks on a tiny gallery: the generated Parquet gallery,
the plain loop and the pipeline's streamed step embedding the same ids to the same vectors, the
output comparison, the RSS sampler and the table arithmetic. No timing assertions: the numbers only
mean something from a full run (benchmarks/README.md)."""
from __future__ import annotations

import json
import math
import mmap
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from benchmarks import gallery_scale as bench
from orchestrator.data.tensors import to_model_input
from orchestrator.gallery import read_shard
from orchestrator.geometry.geometry import Geometry
from orchestrator.methods.loading import load_generation

ITEMS, PER_FILE, PER_SHARD = 2000, 700, 500  # three files (700, 700, 600 rows), four shards


@pytest.fixture(scope="module")
def gallery(tmp_path_factory):
    return bench.generate_gallery(tmp_path_factory.mktemp("scale") / "gallery", ITEMS, items_per_file=PER_FILE)


@pytest.fixture(scope="module")
def job(gallery, tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    uri = str(folder / "generation")
    return bench.Job(str(gallery), str(folder / "out"), uri, bench.save_encoder(uri), items_per_shard=PER_SHARD,
                     batch_size=128, concurrency=2, lineage=str(folder / "lineage.db"))


@pytest.fixture(scope="module")
def plain(job):
    return bench.run_plain(bench.Job(**{**vars(job), "storage": job.storage + "/plain"}))


def expected_embeddings(job, gallery, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids, embeddings) of gallery ``rows`` computed here: the files' pixels → the checkpoint's encoder."""
    table = pq.read_table(gallery)
    pixels = np.stack([np.asarray(table.column("image")[int(r)].as_py(), dtype=np.uint8) for r in rows])
    model, _card = load_generation(job.checkpoint_uri)
    with torch.no_grad():
        out = model.encoder(to_model_input(pixels.reshape(-1, 8, 8, 3), 8, bench.MEAN, bench.STD)).embedding
    return table.column("id").to_numpy()[rows], out.numpy()


def test_the_gallery_has_the_requested_items_in_many_files_with_unique_ids(gallery):
    files = sorted(gallery.glob("*.parquet"))
    assert [pq.ParquetFile(f).metadata.num_rows for f in files] == [700, 700, 600]
    table = pq.read_table(gallery)
    ids = table.column("id").to_numpy()
    assert len(table) == ITEMS and np.unique(ids).size == ITEMS
    assert table.column("key").to_pylist()[:2] == [f"photos/{ids[0]}.raw", f"photos/{ids[1]}.raw"]
    assert len(table.column("image")[0].as_py()) == 8 * 8 * 3


def test_a_generated_gallery_is_reused_and_regenerated_when_asked_for_another_size(tmp_path):
    folder = bench.generate_gallery(tmp_path / "g", 300, items_per_file=100)
    stamp = (folder / "part-00000.parquet").stat().st_mtime_ns
    bench.generate_gallery(folder, 300, items_per_file=100)
    assert (folder / "part-00000.parquet").stat().st_mtime_ns == stamp  # reused, not written again
    bench.generate_gallery(folder, 250, items_per_file=100)
    assert pq.read_table(folder).num_rows == 250 and len(list(folder.glob("*.parquet"))) == 3


def test_the_plain_loop_writes_every_item_once_in_shards_with_its_vector_and_uri(job, gallery, plain):
    assert plain["items"] == ITEMS and plain["shards"] == ITEMS // PER_SHARD == len(plain["shard_uris"])
    shards = [read_shard(uri) for uri in plain["shard_uris"]]
    ids = np.concatenate([s.ids for s in shards])
    assert [len(s) for s in shards] == [PER_SHARD] * 4 and np.array_equal(ids, bench.ID_BASE + np.arange(ITEMS))
    rows = np.array([0, 699, 700, 1999])
    expected_ids, expected = expected_embeddings(job, gallery, rows)
    stored = np.concatenate([s.embeddings for s in shards])[rows]
    np.testing.assert_array_equal(ids[rows], expected_ids)
    np.testing.assert_allclose(stored, expected, atol=1e-5, rtol=0)
    assert shards[3].attributes.column("uri").to_pylist()[-1] == f"photos/{bench.ID_BASE + 1999}.raw"
    assert plain["peak_rss_mb"] >= plain["start_rss_mb"] > 0


@pytest.mark.e2e
def test_the_streamed_step_embeds_the_same_ids_to_the_same_vectors(job, gallery, plain):
    # 2,000 items run Ray Data's executor in the driver by default (``embedding.executor`` auto):
    # here in its coordinator actor, as the benchmark's sizes do
    streamed = bench.run_streamed(bench.Job(**{**vars(job), "storage": job.storage + "/streamed",
                                               "executor": "coordinator"}))
    assert streamed["items"] == ITEMS and streamed["shards"] == 4
    compared = bench.compare_outputs(plain["shard_uris"], streamed["shard_uris"])
    assert compared["items"] == ITEMS and compared["max_abs_difference"] <= 1e-5
    last = read_shard(streamed["shard_uris"][-1])
    assert last.attributes.column("uri").to_pylist()[-1] == f"photos/{bench.ID_BASE + 1999}.raw"
    assert streamed["spilled_mb"] == 0.0 and streamed["peak_rss_mb"] >= streamed["start_rss_mb"] > 0
    assert sum(streamed["shards_by_node"].values()) == 4  # one local node wrote every shard
    assert 0 < streamed["driver_result_bytes"] < 4 * 2000  # metadata per shard update, never items
    assert streamed["driver_cpu_s"] > 0 and 0 < streamed["first_batch_s"] <= streamed["first_shard_s"]
    assert streamed["write_s"] > 0 and streamed["commit_ms_per_update"] > 0
    assert streamed["coordinator_cpu_s"] > 0  # Ray Data's coordinator actor found and read: the executor ran there
    json.dumps(streamed)


def test_the_commit_clock_counts_the_thread_cpu_of_each_commit_and_passes_errors_on():
    class Executor:
        def __init__(self):
            self.calls = []

        def _commit(self, entry, result, generation):
            self.calls.append((entry, result, generation))
            deadline = time.thread_time() + 0.02  # 20 ms of this thread's CPU
            while time.thread_time() < deadline:
                pass
            if entry == "bad":
                raise RuntimeError("lineage refused")

    executor = Executor()
    clock = bench.CommitClock(executor)
    assert clock.ms_per_commit() is None
    started = time.thread_time()
    executor._commit("a", "r", "g1")
    with pytest.raises(RuntimeError, match="lineage refused"):
        executor._commit("bad", "r", "g1")
    spent_ms = (time.thread_time() - started) * 1e3
    assert executor.calls == [("a", "r", "g1"), ("bad", "r", "g1")]
    assert len(clock.spent) == 2
    assert 20 <= clock.ms_per_commit() <= spent_ms / 2


def test_outputs_compare_across_shard_boundaries_and_refuse_other_ids(tmp_path, plain, job):
    merged = bench.PlainShardWriter(str(tmp_path), 1500, None)  # other boundaries: 1,500 + 500 items
    shards = [read_shard(uri) for uri in plain["shard_uris"]]
    merged.geometry = Geometry(shards[0].space, shards[0].curv)
    for shard in shards:
        merged.add(shard.ids, shard.attributes.column("uri").to_pylist(), shard.embeddings, shard.uncertainty)
    merged.flush()
    assert len(merged.uris) == 2
    assert bench.compare_outputs(plain["shard_uris"], merged.uris) == {"items": ITEMS, "max_abs_difference": 0.0}
    with pytest.raises(ValueError, match="more items"):
        bench.compare_outputs(plain["shard_uris"], merged.uris[:1])
    with pytest.raises(ValueError, match="different ids"):
        bench.compare_outputs(plain["shard_uris"][1:], merged.uris)


def touched_pages(mib: int) -> mmap.mmap:
    """``mib`` MiB of fresh anonymous memory, every page written: resident pages the process did
    not hold before, whatever its allocator kept from earlier tests (a freed NumPy array's heap
    pages may stay resident and be handed out again without raising the RSS)."""
    pages = mmap.mmap(-1, mib << 20)
    for offset in range(0, mib << 20, mmap.PAGESIZE):
        pages[offset] = 1
    return pages


def test_peak_rss_sees_an_allocation_made_inside_the_block():
    with bench.PeakRss() as rss:
        touched_pages(200).close()
    assert rss.peak_mb - rss.start_mb >= 150


def test_peak_rss_is_the_blocks_own_not_an_earlier_peak_of_the_process():
    touched_pages(300).close()  # a 300 MiB peak before the block
    with bench.PeakRss() as rss:
        touched_pages(20).close()
    assert 15 <= rss.peak_mb - rss.start_mb < 100


def test_spill_is_read_from_the_store_stats_text():
    text = ("--- Aggregate object store stats across all nodes ---\nPlasma memory usage 50 MiB, 1 objects, 50.0% full\n"
            "Spilled 200 MiB, 4 objects, avg write throughput 570 MiB/s\nRestored 150 MiB, 3 objects, avg read")
    assert bench.parse_spill(text) == {"spilled_mb": 200.0, "spilled_objects": 4.0, "restored_mb": 150.0,
                                       "restored_objects": 3.0}
    assert bench.parse_spill("Plasma memory usage 0 MiB")["spilled_mb"] == 0.0


def record(path: str, size: int, wall: float, cores: int, rss: float, where: str = "local") -> dict:
    return {"where": where, "path": path, "size": size, "items": size, "cores": cores, "wall_s": wall,
            "start_rss_mb": 500.0, "peak_rss_mb": rss, "spilled_mb": 0.0, "load": (1.0, 1.0, 1.0)}


def test_table_arithmetic_against_a_computation_written_out():
    records = [record("plain", 10**5, 50.0, 1, 900.0), record("streamed", 10**5, 40.0, 2, 1000.0),
               record("plain", 10**6, 500.0, 1, 910.0), record("streamed", 10**6, 300.0, 2, 1200.0),
               record("plain", 10**7, 5000.0, 1, 920.0), record("streamed", 10**7, 4000.0, 2, 1600.0),
               record("plain", 10**5, 80.0, 1, 900.0, "s3"), record("streamed", 10**5, 100.0, 2, 1000.0, "s3")]
    rows = {(r["where"], r["path"], r["size"]): r for r in bench.summarise(records)}
    streamed_1e6 = rows[("local", "streamed", 10**6)]
    assert streamed_1e6["items_per_s"] == pytest.approx(10**6 / 300.0)
    assert streamed_1e6["per_core"] == pytest.approx(10**6 / 300.0 / 2)
    assert streamed_1e6["ratio_per_core"] == pytest.approx((10**6 / 600.0) / (10**6 / 500.0))  # 0.8333
    assert streamed_1e6["growth_per_10x"] == pytest.approx(300.0 / 40.0)
    assert rows[("local", "streamed", 10**7)]["growth_per_10x"] == pytest.approx(4000.0 / 300.0)
    assert rows[("local", "plain", 10**5)]["growth_per_10x"] is None
    assert rows[("s3", "streamed", 10**5)]["ratio_per_core"] == pytest.approx((10**5 / 200.0) / (10**5 / 80.0))
    assert bench.growth_per_decade(10**5, 10.0, 10**7, 1000.0) == pytest.approx(10.0)  # two decades, linear
    assert bench.growth_per_decade(10**5, 10.0, 10**7, 4000.0) == pytest.approx(math.sqrt(400.0))
    targets = bench.verdicts(list(rows.values()))
    assert targets["driver_rss_flat"] == {"value": pytest.approx(1.6), "limit": 1.5, "met": False}
    assert targets["throughput_per_core"]["value"] == pytest.approx(0.625) and targets["throughput_per_core"]["met"] is False
    assert targets["time_linear"]["value"] == pytest.approx(4000.0 / 300.0) and targets["time_linear"]["met"] is False
    assert targets["driver_rss_under_2gb"]["met"] is True
    s3 = bench.verdicts(list(rows.values()), "s3")
    assert s3["driver_rss_flat"]["met"] is None and s3["time_linear"]["met"] is None  # one size only
    table = bench.format_table(list(rows.values()))
    assert "local time_linear: 13.333 (limit 12.5): NOT met" in table and "s3 time_linear: - " in table


def test_two_plain_halves_read_every_file_once_and_the_pair_is_the_two_core_baseline(gallery):
    halves = [np.concatenate([ids for ids, _keys, _pixels in bench.plain_batches(str(gallery), 256, 8, (k, 2))])
              for k in range(2)]
    assert np.array_equal(np.sort(np.concatenate(halves)), bench.ID_BASE + np.arange(ITEMS))
    assert [h.size for h in halves] == [700 + 600, 700]  # files 0 and 2, file 1
    records = [dict(record("plain", 10**6, 50.0, 1, 900.0), steady_items_per_s=21000.0),
               dict(record("plain x2", 10**6, 40.0, 2, 900.0), steady_items_per_s=26000.0),
               dict(record("streamed", 10**6, 45.0, 2, 900.0), steady_items_per_s=24700.0)]
    rows = {r["path"]: r for r in bench.summarise(records)}
    assert rows["plain x2"]["ratio_per_core"] == pytest.approx((10**6 / 80.0) / (10**6 / 50.0))  # 2 cores: 1.25x
    assert rows["streamed"]["ratio_vs_plain_x2"] == pytest.approx(40.0 / 45.0)
    assert rows["streamed"]["steady_ratio_vs_plain_x2"] == pytest.approx(24700.0 / 26000.0)  # 0.95
    assert bench.verdicts(list(rows.values()))["steady_throughput_vs_plain_x2"]["met"] is True


def test_the_drivers_marginal_cpu_per_item_is_the_growth_between_two_sizes():
    records = [dict(record("streamed", 10**5, 40.0, 2, 900.0), driver_cpu_s=2.0, coordinator_cpu_s=1.5),
               dict(record("streamed", 10**6, 300.0, 2, 900.0), driver_cpu_s=2.9, coordinator_cpu_s=4.2),
               dict(record("streamed", 10**7, 3000.0, 2, 900.0), driver_cpu_s=12.9, coordinator_cpu_s=31.2)]
    rows = bench.summarise(records)
    assert rows[0]["driver_cpu_us_per_item"] is None and rows[0]["coordinator_cpu_us_per_item"] is None
    assert rows[1]["coordinator_cpu_us_per_item"] == pytest.approx(2.7 / 900_000 * 1e6)  # 3.0 µs
    assert rows[2]["coordinator_cpu_us_per_item"] == pytest.approx(27.0 / 9_000_000 * 1e6)  # 3.0 µs
    assert rows[1]["driver_cpu_us_per_item"] == pytest.approx(0.9 / 900_000 * 1e6)  # 1.0 µs
    assert rows[2]["driver_cpu_us_per_item"] == pytest.approx(10.0 / 9_000_000 * 1e6)  # 1.11 µs
    target = bench.verdicts(rows)["driver_cpu_us_per_item"]
    assert target["value"] == pytest.approx(10.0 / 9.0) and target["met"] is False
    assert "local driver_cpu_us_per_item: 1.111 (limit 1.0): NOT met" in bench.format_table(rows)


def test_steady_rates_count_the_items_after_the_first_batch_and_compare_per_core(capsys, monkeypatch):
    now = iter([100.0, 105.0, 125.0])  # start, first batch, end (later batches read no clock)
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(now))
    clock = bench.ProgressClock()
    clock.progress_line("scale: embedding 1000 items of 2 shard update(s) with g0")  # not a progress count
    assert clock.first is None
    clock.progress_line("scale: embedded 250/1000 items (25%, 10 items/s)")
    clock.items_out(600)  # later batches leave the first alone
    assert clock.first == (105.0, 250) and "embedded 250/1000" in capsys.readouterr().out
    assert clock.summary(1000) == {"first_batch_s": 5.0, "steady_items_per_s": 750 / 20.0}
    monkeypatch.setattr(bench.time, "perf_counter", lambda: 0.0)
    assert bench.ProgressClock().summary(1000) == {"first_batch_s": None, "steady_items_per_s": None}
    records = [dict(record("plain", 10**5, 10.0, 1, 900.0), steady_items_per_s=12000.0),
               dict(record("streamed", 10**5, 20.0, 2, 900.0), steady_items_per_s=15000.0)]
    rows = bench.summarise(records)
    assert rows[1]["steady_ratio_per_core"] == pytest.approx(15000.0 / 2 / 12000.0)
    assert rows[0]["steady_ratio_per_core"] == pytest.approx(1.0)
