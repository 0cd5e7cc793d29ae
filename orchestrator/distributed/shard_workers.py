"""Ray adapter: shard updates run on workers spread over the cluster; the driver gets metadata.

Each shard update (``shard_update.ShardUpdate``) goes to one ``ShardUpdateWorker`` actor, which
reads the update's items itself (``gallery_read.entry_reader``: the source's files, or a stored
shard file read again), decodes and embeds them, writes the shard's Parquet file and FAISS index
and returns a ``ShardUpdateResult``: URIs, sha256s and counts, a few hundred bytes whatever the
shard's size. No embedding, id array or image reaches the driver, so the driver's work grows with
the number of shard updates, not of items, and adding nodes adds workers.

Resources: without GPUs every worker embeds with its own copy of the generation (``num_cpus``
each, ``concurrency`` workers). With ``num_gpus`` set, ``concurrency`` ``GpuEmbedder`` actors hold
the model on their GPUs and only run the encoder; the ``writers`` CPU workers read, decode, send
pixel batches to them, and build the indexes, so no GPU is held while an index is built.

A worker that dies (its node lost, ``kill -9``) loses only its update: ``run_shard_updates``
asks ``on_lost`` whether to run the update again (the executor counts it as a new attempt in the
lineage) on a new worker. An error of the update itself (items not as planned, a file the lineage
does not know) is raised in the driver as it was raised in the worker.
"""
from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from orchestrator.config.gallery import EmbeddingSpec
from orchestrator.data.gallery_sources import GallerySource, ImageFormat, decode_images
from orchestrator.distributed.gallery_read import EntryRead, entry_reader, needs_source_ref
from orchestrator.shard_update import PixelEmbedder, ShardTarget, ShardUpdate, ShardUpdateResult, run_shard_update

MAX_IN_FLIGHT_PER_WORKER = 2  # one update running, one queued: the next read starts at once


def worker_count(resources: EmbeddingSpec) -> int:
    """Shard-update workers: ``concurrency`` without GPUs (each embeds), else ``writers`` (default 2
    per GPU embedder)."""
    return resources.concurrency if not resources.num_gpus else (resources.writers or 2 * resources.concurrency)


@dataclass(frozen=True)
class GenerationModel:
    """The generation the workers embed with: its checkpoint (sha256-checked when loaded), its
    space and curvature, and the preprocessing (image size, normalisation, the source's format)."""

    name: str
    checkpoint_uri: str
    sha256: str
    space: str
    curv: float
    image_size: int
    image_format: ImageFormat
    mean: tuple[float, ...]
    std: tuple[float, ...]
    storage_options: dict | None = None

    def embedder(self, device: str) -> PixelEmbedder:
        from orchestrator.storage import load_generation

        model, _card = load_generation(self.checkpoint_uri, expected_sha256=self.sha256, map_location=device,
                                       storage_options=self.storage_options)
        return PixelEmbedder(model, self.image_size, self.mean, self.std, device)


class GpuEmbedder:
    """Ray actor: the generation's encoder on one GPU (the CPU when none is visible);
    ``embed(pixels (B, S, S, 3) uint8)`` → (embedding (B, D), uncertainty (B,))."""

    def __init__(self, model: GenerationModel, threads: int):
        import torch

        torch.set_num_threads(max(1, threads))
        self.embedder = model.embedder("cuda" if torch.cuda.is_available() else "cpu")

    def embed(self, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.embedder(pixels)

    def gpu_ids(self) -> list[str]:
        """The GPUs Ray reserved for this actor."""
        import ray

        return [str(gpu) for gpu in ray.get_gpu_ids()]


class ShardUpdateWorker:
    """Ray actor: runs shard updates (``run``) with the generation loaded once, or with the
    ``embedders`` (GPU actors) it sends decoded batches to."""

    def __init__(self, model: GenerationModel, target: ShardTarget, metadata_columns: tuple[str, ...],
                 batch_size: int, threads: int, embedders: Sequence[Any] = ()):
        import ray
        import torch

        constructed = time.time()  # the process is up and this module imported
        torch.set_num_threads(max(1, threads))
        self.model, self.target, self.metadata_columns, self.batch_size = model, target, metadata_columns, batch_size
        self.embedders = list(embedders)
        self.local = None if self.embedders else model.embedder("cpu")
        self.started = {"worker_constructed": constructed, "model_loaded": time.time()}
        self.node = f"{socket.gethostname()}:{ray.get_runtime_context().get_node_id()[:12]}:{os.getpid()}"
        self.gpus = {"worker_gpus": [str(gpu) for gpu in ray.get_gpu_ids()],
                     "embedder_gpus": sorted({gpu for ids in ray.get([e.gpu_ids.remote() for e in self.embedders])
                                              for gpu in ids})}
        self.calls = 0

    def _embed(self, block: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        pixels = decode_images(block.column("image"), self.model.image_format, self.model.image_size)
        if self.local is not None:
            return self.local(pixels)
        import ray

        self.calls += 1
        return ray.get(self.embedders[self.calls % len(self.embedders)].embed.remote(pixels))

    def run(self, update: ShardUpdate, read: Callable[[], Iterator[pa.Table]]) -> ShardUpdateResult:
        result = run_shard_update(update, read(), self._embed, self.model.name, self.model.space, self.model.curv,
                                  self.metadata_columns, self.target, self.batch_size, node=self.node)
        result.timing.update(self.gpus, **self.started)
        return result


def run_shard_updates(source: GallerySource, work: Sequence[tuple[ShardUpdate, EntryRead]], model: GenerationModel,
                      target: ShardTarget, resources: EmbeddingSpec,
                      on_lost: Callable[[ShardUpdate, BaseException], ShardUpdate | None]) -> Iterator[ShardUpdateResult]:
    """Run every (update, the items it reads) of ``source`` on workers spread over the cluster;
    yield each result as it completes (any order). Ray must be initialised. A worker lost
    mid-update: ``on_lost(update, error)`` returns the update to run again on a new worker, or
    None to raise the error."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    if not work:
        return
    metadata_columns = source.metadata_columns
    source_ref = ray.put(source) if needs_source_ref(source, [read for _update, read in work]) else None
    block_rows = 4 * resources.batch_size
    embedders = []
    if resources.num_gpus:
        actor = ray.remote(GpuEmbedder).options(num_cpus=resources.num_cpus, num_gpus=resources.num_gpus)
        embedders = [actor.remote(model, int(resources.num_cpus)) for _ in range(resources.concurrency)]
    cpus = 1.0 if resources.num_gpus else resources.num_cpus
    worker_class = ray.remote(ShardUpdateWorker).options(num_cpus=cpus, scheduling_strategy="SPREAD", max_restarts=0)

    def new_worker():
        return worker_class.remote(model, target, metadata_columns, resources.batch_size, int(cpus), embedders)

    workers = [new_worker() for _ in range(min(worker_count(resources), len(work)))]
    readers = {update.key: entry_reader(source, source_ref, read, block_rows) for update, read in work}
    queue = [update for update, _read in reversed(work)]  # pop() takes them in the plan's order
    in_flight: dict[Any, tuple[ShardUpdate, int]] = {}
    load = [0] * len(workers)
    try:
        while queue or in_flight:
            for slot in range(len(workers)):
                while queue and load[slot] < MAX_IN_FLIGHT_PER_WORKER:
                    update = queue.pop()
                    in_flight[workers[slot].run.remote(update, readers[update.key])] = (update, slot)
                    load[slot] += 1
            [done], _ = ray.wait(list(in_flight), num_returns=1)
            update, slot = in_flight.pop(done)
            load[slot] -= 1
            try:
                result = ray.get(done)
            except RayActorError as lost:
                # the worker is gone with whatever else it held: each of its updates runs again
                # (as a new attempt: it may have written some of its files)
                held = [ref for ref, (_other, other_slot) in in_flight.items() if other_slot == slot]
                for lost_update in [update] + [in_flight.pop(ref)[0] for ref in held]:
                    again = on_lost(lost_update, lost)
                    if again is None:
                        raise
                    queue.append(again)
                load[slot], workers[slot] = 0, new_worker()
                continue
            except RayTaskError as failed:
                # the update's own error as the worker raised it; the worker's traceback is chained (-v)
                raise failed.cause from failed
            yield result
    finally:
        for actor in [*workers, *embedders]:
            ray.kill(actor)
