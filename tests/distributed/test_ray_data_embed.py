"""The gallery step's embedding stages (a Ray Data actor pool) equal the local embedding path (the
local Ray: ``local_ray`` of tests/distributed/conftest.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrator.config.gallery import EmbeddingSpec
from orchestrator.data import ImageTensorDataset, channel_statistics, load_digits
from orchestrator.data.gallery_sources import MemorySource
from orchestrator.distributed.gallery_step import embed_gallery
from orchestrator.distributed.generation_model import GenerationModel
from orchestrator.geometry import lorentz
from orchestrator.methods import create_method, embed_dataset
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.shard_update import ShardUpdate, UpdateKind

pytestmark = pytest.mark.e2e


def embed_images(images, uri: str, sha256: str, mean, std, settings: EmbeddingSpec | None = None):
    source = MemorySource(images, "digits:test")
    model = GenerationModel.from_checkpoint("g0", uri, sha256, 32, source.image_format, mean, std)
    return embed_gallery(source, [ShardUpdate(UpdateKind.EMBED, 0, source.num_items, rows=(0, source.num_items))],
                         model, settings)


def test_actor_pool_embeddings_equal_the_local_ones(local_ray, tmp_path):
    train, gallery = load_digits("train"), load_digits("test")
    mean, std = channel_statistics(train)
    torch.manual_seed(0)
    method = create_method("hbct")
    model = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=16), 10, range(10)).eval()
    card = save_generation(model, method, None, str(tmp_path / "g0"), name="g0")

    embedded = embed_images(gallery, str(tmp_path / "g0"), card.sha256, mean, std,
                            EmbeddingSpec(batch_size=128, concurrency=2, rows_per_task=100)).materialize()
    # one actor call, and one output block, per read task of at most rows_per_task rows
    assert embedded.num_blocks() == -(-len(gallery.ids) // 100) > 1
    rows = embedded.to_pandas().sort_values("id")
    assert rows["id"].tolist() == sorted(gallery.ids.tolist())  # every item once
    expected, labels = embed_dataset(model, ImageTensorDataset(gallery, 32, mean, std))
    order = np.argsort(gallery.ids)
    embeddings = np.stack(rows["embedding"].to_numpy())
    np.testing.assert_allclose(embeddings, expected.embedding.numpy()[order], atol=1e-5)
    np.testing.assert_array_equal(rows["label"].to_numpy(), labels.numpy()[order])
    np.testing.assert_allclose(rows["uncertainty"].to_numpy(),
                               lorentz.uncertainty(torch.from_numpy(embeddings), 1.0).numpy(), atol=1e-6)
    assert set(rows["entry"]) == {0}


def test_a_wrong_checkpoint_hash_fails(local_ray, tmp_path):
    gallery = load_digits("test").subset(np.arange(16))
    method = create_method("independent")
    model = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=8), 10, range(10)).eval()
    save_generation(model, method, None, str(tmp_path / "g0"), name="g0")
    with pytest.raises(Exception, match="checksum mismatch"):
        embed_images(gallery, str(tmp_path / "g0"), "0" * 64, (0.5,) * 3, (0.25,) * 3).to_pandas()
