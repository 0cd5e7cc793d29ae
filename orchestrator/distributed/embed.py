"""Ray Data adapter: embed gallery items with one generation through an actor pool.

The images go into Ray's object store once (``ray.put``); the dataset itself is only the row
positions to embed, so blocks are tiny and every actor reads the images zero-copy from its node's
object store. Each actor loads the generation once (sha256-checked checkpoint) and embeds
batches of uint8 images; rows come out with the item id, its label, the embedding in the
generation's space, the hyperbolic uncertainty (NaN for flat spaces) and the generation name.
No science here: the model and the preprocessing are the same functions a local run uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from orchestrator.data.images import LabeledImages, to_model_input
from orchestrator.geometry import lorentz
from orchestrator.geometry.spaces import Space
from orchestrator.storage import load_generation


@dataclass(frozen=True)
class EmbeddingSettings:
    """How a gallery is embedded: batch size, actor-pool size, resources per actor."""

    batch_size: int = 256
    concurrency: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0


class GenerationEmbedder:
    """Ray Data callable class: ``batch {"data" (B,) row positions}`` →
    ``{"id", "label", "embedding" (B, D) float32, "uncertainty" (B,), "generation"}``.

    items: a one-element list holding the ObjectRef of ``{"image" (N,H,W,3) uint8, "id" (N,),
    "label" (N,)}`` (wrapped so that Ray hands the reference, not a copy, to the constructor)."""

    def __init__(self, items: list, checkpoint_uri: str, sha256: str, name: str, image_size: int,
                 mean: tuple[float, ...], std: tuple[float, ...], storage_options: dict | None = None):
        import ray

        torch.set_num_threads(1)
        self.items = ray.get(items[0])
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model, self.card = load_generation(checkpoint_uri, expected_sha256=sha256, map_location=self.device,
                                                storage_options=storage_options)
        self.name, self.image_size, self.mean, self.std = name, image_size, mean, std

    @torch.no_grad()
    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        rows = np.asarray(batch["data"], dtype=np.int64)
        images = to_model_input(self.items["image"][rows], self.image_size, self.mean, self.std).to(self.device)
        out = self.model.encoder(images)
        embedding = out.embedding.float()
        if self.model.space is Space.LORENTZ:
            uncertainty = lorentz.uncertainty(embedding, self.model.curv).cpu().numpy()
        else:
            uncertainty = np.full(len(embedding), np.nan, dtype=np.float32)
        return {
            "id": self.items["id"][rows].astype(np.int64),
            "label": self.items["label"][rows].astype(np.int64),
            "embedding": embedding.cpu().numpy(),
            "uncertainty": uncertainty.astype(np.float32),
            "generation": np.full(len(embedding), self.name),
        }


_BLOCKS_PER_ACTOR = 8


def quiet_ray_data() -> None:
    """Ray Data's per-dataset progress bars and INFO lines off in this driver (the pipeline
    prints its own progress: one line per committed shard)."""
    import logging

    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)


def embed_with_ray_data(images: LabeledImages, checkpoint_uri: str, sha256: str, name: str, image_size: int,
                        mean: tuple[float, ...], std: tuple[float, ...],
                        settings: EmbeddingSettings = EmbeddingSettings(),
                        storage_options: dict | None = None, positions: np.ndarray | None = None):
    """A lazy ``ray.data.Dataset`` of the embeddings by generation ``name`` of the items of
    ``images`` at ``positions`` (all when None); Ray must be initialised. Consume it with
    ``.iter_batches()``, ``.to_pandas()`` or ``.write_parquet()``."""
    import ray
    import ray.data
    from ray.data import ActorPoolStrategy

    rows = np.arange(len(images), dtype=np.int64) if positions is None else np.asarray(positions, dtype=np.int64)
    items = ray.put({"image": np.ascontiguousarray(images.images), "id": np.asarray(images.ids, dtype=np.int64),
                     "label": np.asarray(images.labels, dtype=np.int64)})
    # one block per batch-sized chunk (at most 64), made here: a repartition task could not be
    # scheduled while the actor pool holds every CPU
    # blocks of whole batches (no remainder batch per block), about _BLOCKS_PER_ACTOR per actor:
    # every block is one actor task, whose fixed cost is paid per block, not per batch
    batch = max(settings.batch_size, 1)
    per_block = batch * max(1, -(-len(rows) // (batch * _BLOCKS_PER_ACTOR * settings.concurrency)))
    blocks = [rows[start:start + per_block] for start in range(0, len(rows), per_block)] or [rows]
    return ray.data.from_numpy(blocks).map_batches(
        GenerationEmbedder,
        fn_constructor_kwargs={"items": [items], "checkpoint_uri": checkpoint_uri, "sha256": sha256, "name": name,
                               "image_size": image_size, "mean": tuple(mean), "std": tuple(std),
                               "storage_options": storage_options},
        batch_size=settings.batch_size,
        compute=ActorPoolStrategy(size=settings.concurrency),
        num_cpus=settings.num_cpus,
        num_gpus=settings.num_gpus or None,
        batch_format="numpy",
        zero_copy_batch=True,
    )
