"""With ``embedding.num_gpus`` the images are decoded by CPU tasks, the model runs on actors
holding the GPUs, and each update's index is built by a task that holds none; the shards hold the
CPU-only path's items and, to float tolerance, its embeddings. CPU-only test: the local Ray
declares one GPU it does not have; torch sees no CUDA device, so the "GPU" actor runs the model on
its CPU, with the GPU resource reserved."""
from __future__ import annotations

import time

import numpy as np
import pytest
import ray

from orchestrator.gallery import read_shard
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


def test_a_gpu_model_stage_writes_the_cpu_paths_files(ray_with_a_declared_gpu, tmp_path, monkeypatch):
    from orchestrator.distributed import gallery_step

    stages = []
    real_dataset = gallery_step.step_dataset

    def recording_dataset(*args, **kwargs):
        dataset = real_dataset(*args, **kwargs)
        stages.append(str(dataset))  # the logical plan: one operator per stage
        return dataset

    monkeypatch.setattr(gallery_step, "step_dataset", recording_dataset)
    _config, cpu_store, cpu = first_generation(tmp_path / "cpu", items_per_shard=100, concurrency=1)
    cpu_results = cpu.executor.execute(cpu.planner.committed_plan("g0-old"), "g0-old")
    _config, gpu_store, gpu = first_generation(tmp_path / "gpu", items_per_shard=100, concurrency=1, num_gpus=1,
                                               num_cpus=1)
    gpu_results = gpu.executor.execute(gpu.planner.committed_plan("g0-old"), "g0-old")

    assert "decode_stage" not in stages[0] and "decode_stage" in stages[1]  # decoded before the GPU stage
    assert len(cpu_results) == len(gpu_results) == 6
    # the same model on the same items: the same shards, the embeddings equal to float tolerance
    # (a model batch can hold other items on the two paths, which moves the last bits)
    assert [(s.index, s.n_items) for s in gpu_store.shards("photos")] == \
        [(s.index, s.n_items) for s in cpu_store.shards("photos")]
    for gpu_shard, cpu_shard in zip(gpu_store.shards("photos"), cpu_store.shards("photos")):
        on_gpu, on_cpu = read_shard(gpu_shard.embeddings_uri), read_shard(cpu_shard.embeddings_uri)
        assert np.array_equal(on_gpu.ids, on_cpu.ids) and np.array_equal(on_gpu.rows, on_cpu.rows)
        np.testing.assert_allclose(on_gpu.embeddings, on_cpu.embeddings, rtol=1e-5, atol=1e-5)
    assert np.array_equal(np.sort(served_rows(gpu_store)), np.arange(539))
    assert resources_back({"GPU": 1, "CPU": 3})  # the step's actors are gone: nothing held after it
    cpu_store.close()
    gpu_store.close()
