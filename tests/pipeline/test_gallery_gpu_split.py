"""With ``embedding.num_gpus`` the model runs on GPU actors and everything else on CPU workers that
hold no GPU (so none is held while an index is built), and the shard files are byte for byte those
of the CPU-only path. CPU-only test: the local Ray declares one GPU it does not have; torch sees
no CUDA device, so the "GPU" actor runs the model on its CPU, with the GPU resource reserved."""
from __future__ import annotations

import time

import numpy as np
import pytest
import ray

from streamed_gallery import first_generation, served_rows

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ray_with_a_declared_gpu():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=3, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def resources_back(expected: dict[str, float], within_s: float = 60) -> bool:
    """Whether Ray's available resources return to ``expected`` (actor ends are asynchronous)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if all(ray.available_resources().get(k) == v for k, v in expected.items()):
            return True
        time.sleep(0.2)
    return False


def test_gpu_embedders_and_cpu_writers_write_the_cpu_paths_files(ray_with_a_declared_gpu, tmp_path):
    _config, cpu_store, cpu = first_generation(tmp_path / "cpu", items_per_shard=100, concurrency=1)
    cpu_results = cpu.execute(cpu.committed_plan("g0-old"), "g0-old")
    _config, gpu_store, gpu = first_generation(tmp_path / "gpu", items_per_shard=100, concurrency=1, num_gpus=1,
                                               num_cpus=1, writers=2)
    gpu_results = gpu.execute(gpu.committed_plan("g0-old"), "g0-old")

    assert {gpu for r in cpu_results for gpu in r.timing["worker_gpus"]} == set()
    assert [r.timing["worker_gpus"] for r in gpu_results] == [[]] * len(gpu_results)  # writers hold no GPU
    assert [r.timing["embedder_gpus"] for r in gpu_results] == [["0"]] * len(gpu_results)  # the model does
    assert len({r.timing["node"] for r in gpu_results}) == 2  # both writers took updates
    # the same model on the same batches: the same bytes, whichever process ran it
    assert [(s.index, s.sha256, s.n_items) for s in gpu_store.shards("photos")] == \
        [(s.index, s.sha256, s.n_items) for s in cpu_store.shards("photos")]
    assert np.array_equal(np.sort(served_rows(gpu_store)), np.arange(539))
    assert resources_back({"GPU": 1, "CPU": 3})  # the step's actors are gone: nothing held after it
    cpu_store.close()
    gpu_store.close()
