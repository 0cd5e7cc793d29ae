"""Ray Data adapter: embed gallery items with one generation through an actor pool, the rows
consumed by the caller (the re-embedding benchmarks; the pipeline's gallery step writes shards on
workers instead: ``distributed.shard_workers``).

The items stream from the gallery source (``orchestrator.distributed.gallery_read``: read tasks
over files or row ranges, a bounded block at a time) into an actor pool; each actor loads the
generation once (sha256-checked checkpoint), decodes its batches (encoded bytes or raw pixels, the
source's ``image_format``) and embeds them. Rows come out with the entry they belong to, the item
id, its gallery row, label, URI and metadata columns, the embedding in the generation's space, the
hyperbolic uncertainty (NaN for flat spaces) and the generation name. No science here: the model,
the decoding and the preprocessing are the same functions a local run uses.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from orchestrator.config.gallery import EmbeddingSpec
from orchestrator.data.gallery_sources import GallerySource, ImageFormat, MemorySource, decode_images
from orchestrator.data.images import LabeledImages
from orchestrator.distributed.gallery_read import EntryRead, RowRange, gallery_dataset
from orchestrator.shard_update.embedder import PixelEmbedder
from orchestrator.storage import load_generation


class GenerationEmbedder:
    """Ray Data callable class: a batch of raw items (``gallery_read`` columns: ``entry``, ``row``,
    ``id``, ``uri``, ``label``, ``image`` bytes, metadata…) → the same columns without ``image``,
    plus ``embedding`` (B, D) float32, ``uncertainty`` (B,) and ``generation``."""

    def __init__(self, checkpoint_uri: str, sha256: str, name: str, image_size: int, image_format: ImageFormat,
                 mean: tuple[float, ...], std: tuple[float, ...], storage_options: dict | None = None):
        torch.set_num_threads(1)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model, self.card = load_generation(checkpoint_uri, expected_sha256=sha256, map_location=device,
                                           storage_options=storage_options)
        self.embedder = PixelEmbedder(model, image_size, mean, std, device)
        self.name, self.image_size, self.image_format = name, image_size, image_format

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        embedding, uncertainty = self.embedder(decode_images(batch["image"], self.image_format, self.image_size))
        rows = {name: values for name, values in batch.items() if name != "image"}
        return {**rows, "embedding": embedding, "uncertainty": uncertainty,
                "generation": np.full(len(embedding), self.name)}


def quiet_ray_data() -> None:
    """Ray Data's per-dataset progress bars and INFO lines off in this driver (the pipeline
    prints its own progress: one line per committed shard)."""
    import logging

    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)


def embed_gallery(source: GallerySource, reads: Sequence[EntryRead], checkpoint_uri: str, sha256: str, name: str,
                  image_size: int, mean: tuple[float, ...], std: tuple[float, ...],
                  settings: EmbeddingSpec = EmbeddingSpec(), storage_options: dict | None = None,
                  block_rows: int | None = None, rows_per_task: int | None = None):
    """A lazy ``ray.data.Dataset`` of the embeddings by generation ``name`` of the items that
    ``reads`` name (one ``EntryRead`` per shard update); Ray must be initialised. Consume it with
    ``.iter_batches()``: rows of different entries interleave, each row says its ``entry``.

    At most two read tasks per actor run at once, so the rows in flight (and the shard updates the
    consumer holds open) stay bounded whatever the gallery's size.

    block_rows:    rows per block a read task yields (default 4 batches);
    rows_per_task: rows per read task (default 4 blocks). Ray Data merges the blocks of one task
                   up to its target block size (128 MiB), so the task size, not the block size,
                   decides how many pieces the actors share.
    """
    from ray.data import ActorPoolStrategy

    block = block_rows or max(settings.batch_size, 1) * 4
    dataset = gallery_dataset(source, reads, block_rows=block, rows_per_task=rows_per_task or 4 * block,
                              read_concurrency=2 * settings.concurrency)
    return dataset.map_batches(
        GenerationEmbedder,
        fn_constructor_kwargs={"checkpoint_uri": checkpoint_uri, "sha256": sha256, "name": name,
                               "image_size": image_size, "image_format": source.image_format,
                               "mean": tuple(mean), "std": tuple(std), "storage_options": storage_options},
        batch_size=settings.batch_size,
        compute=ActorPoolStrategy(size=settings.concurrency),
        num_cpus=settings.num_cpus,
        num_gpus=settings.num_gpus or None,
        batch_format="numpy",
        zero_copy_batch=True,
    )


def embed_with_ray_data(images: LabeledImages, checkpoint_uri: str, sha256: str, name: str, image_size: int,
                        mean: tuple[float, ...], std: tuple[float, ...],
                        settings: EmbeddingSpec = EmbeddingSpec(), storage_options: dict | None = None,
                        block_rows: int | None = None, rows_per_task: int | None = None):
    """Every item of an in-memory ``LabeledImages`` embedded by generation ``name``
    (``embed_gallery`` over a ``MemorySource``): a lazy ``ray.data.Dataset``."""
    source = MemorySource(images, "images")
    return embed_gallery(source, [RowRange(0, 0, source.num_items)], checkpoint_uri, sha256, name, image_size, mean,
                         std, settings, storage_options, block_rows, rows_per_task)
