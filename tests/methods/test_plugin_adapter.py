"""A plug-in method with an adapter kind of its own: registered outside the package, its backward
adapter is saved in a generation checkpoint and rebuilt through the adapter registry (storage knows
no method), and the search router maps the plug-in generation's queries by the rebuilt adapter to
search the parent's shard. Every number is checked against the adapter applied by hand."""
from __future__ import annotations

import copy
import json
from datetime import datetime, timezone

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from orchestrator.geometry import Geometry
from orchestrator.index import ShardIndex, build_index
from orchestrator.lineage.records import ShardRecord
from orchestrator.methods import TrainContext, create_method
from orchestrator.methods import registry as method_registry
from orchestrator.methods.common import SupervisedMethod, paired_train_embeddings
from orchestrator.methods.loading import load_generation
from orchestrator.methods.registry import register_method
from orchestrator.models.adapters import BACKWARD_ADAPTER, adapter_class, register_adapter
from orchestrator.models.adapters import registry as adapter_registry
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.search import SearchRouter

ENCODER = EncoderConfig(arch="test_resnet", embed_dim=8)


class RandomImages(Dataset):
    def __init__(self, n: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(n, 3, 16, 16, generator=generator)
        self.labels = torch.arange(n) % 3

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i]), i


@pytest.fixture(scope="module")
def plugin():
    """The plug-in's adapter kind and method, registered as a plug-in module registers them on import,
    and taken out of both registries after this module's tests (other tests list every method)."""

    @register_adapter
    class ScaledPermutation(nn.Module):
        """B(x)_i = scale_i · x_{order_i}: x (..., dim) → (..., dim). ``order`` is a saved buffer (a
        permutation), ``scale`` a parameter; both come back from the checkpoint's state dict."""

        kind = "test_scaled_permutation"

        def __init__(self, dim: int):
            super().__init__()
            self.register_buffer("order", torch.arange(dim))
            self.scale = nn.Parameter(torch.ones(dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[..., self.order] * self.scale

        def to_spec(self) -> dict:
            return {"dim": int(self.order.numel())}

        @classmethod
        def from_spec(cls, spec: dict) -> ScaledPermutation:
            return cls(int(spec["dim"]))

    @register_method
    class ScaledPermutationMethod(SupervisedMethod):
        """CE training, then a backward map new → old space: coordinates matched by rank of variance,
        each scaled by its least-squares factor Σ old_i new_{order_i} / Σ new_{order_i}²."""

        name = "test_scaled_permutation"
        summary = "CE + a scaled-permutation backward adapter (test plug-in)"
        requires_parent = True

        def loss(self, new, old, labels, ctx):
            return {"base": self.base_loss(new, labels)}

        def on_train_end(self, ctx: TrainContext) -> None:
            old_out, new_out, _labels = paired_train_embeddings(ctx, self.name)
            old, new = old_out.embedding, new_out.embedding
            adapter = ScaledPermutation(new.shape[1])
            order = torch.empty_like(adapter.order)
            order[old.var(0).argsort()] = new.var(0).argsort()  # the i-th lowest-variance coordinates meet
            with torch.no_grad():
                adapter.order.copy_(order)
                adapter.scale.copy_((old * new[:, order]).sum(0) / new[:, order].pow(2).sum(0))
            ctx.new_model.adapters[BACKWARD_ADAPTER] = adapter

    try:
        yield ScaledPermutation, ScaledPermutationMethod
    finally:
        del method_registry._METHODS[ScaledPermutationMethod.name]
        del adapter_registry._ADAPTERS[ScaledPermutation.kind]


@pytest.fixture(scope="module")
def generations(plugin, tmp_path_factory):
    """The parent (independent, cosine) and the plug-in child, saved and loaded back."""
    folder = tmp_path_factory.mktemp("plugin")
    torch.manual_seed(0)
    parent_method = create_method("independent")
    parent = parent_method.build_model(ENCODER, num_classes=3, seen_classes=[0, 1, 2]).eval()
    method = create_method("test_scaled_permutation")
    child = method.build_model(ENCODER, num_classes=3, seen_classes=[0, 1, 2]).eval()
    method.on_train_end(TrainContext(new_model=child, old_model=parent, train_data=RandomImages(24, 1), num_classes=3))
    save_generation(parent, parent_method, None, str(folder / "p"), name="p")
    card = save_generation(child, method, None, str(folder / "c"), name="c", parent="p")
    loaded_parent, _ = load_generation(str(folder / "p"))
    loaded, loaded_card = load_generation(str(folder / "c"), expected_sha256=card.sha256)
    return child, loaded, loaded_parent, card, loaded_card, folder


def test_the_plug_in_adapter_is_described_by_its_kind_and_rebuilt_with_its_weights(plugin, generations):
    child, loaded, _parent, card, loaded_card, folder = generations
    ScaledPermutation = plugin[0]
    assert adapter_class("test_scaled_permutation") is ScaledPermutation
    raw = json.loads((folder / "c" / "card.json").read_text())
    assert raw["method"]["name"] == "test_scaled_permutation"
    assert raw["adapters"] == {BACKWARD_ADAPTER: {"kind": "test_scaled_permutation", "dim": 8}}
    assert loaded_card == card
    rebuilt, fitted = loaded.adapters[BACKWARD_ADAPTER], child.adapters[BACKWARD_ADAPTER]
    assert type(rebuilt) is ScaledPermutation
    assert not torch.equal(fitted.order, torch.arange(8)) and not torch.equal(fitted.scale, torch.ones(8))  # fitted
    assert torch.equal(rebuilt.order, fitted.order) and torch.equal(rebuilt.scale, fitted.scale)
    x = torch.randn(5, 8)
    expected = torch.stack([fitted.scale[i] * x[:, int(fitted.order[i])] for i in range(8)], dim=1)  # B by hand
    torch.testing.assert_close(rebuilt(x), expected, rtol=0, atol=0)


def test_the_router_maps_the_plug_in_queries_into_the_parents_shard(generations, tmp_path):
    child, loaded, parent, _card, _loaded_card, _folder = generations
    images = RandomImages(40, 2).images
    with torch.no_grad():
        gallery = parent.encoder(images[:30]).embedding.double().numpy()
        queries = loaded.encoder(images[30:]).embedding.float()
    ids = np.arange(30) * 5 + 3
    uri = str(tmp_path / "shard-0.index")
    build_index(gallery, "cosine", "flat", ids).save(uri)
    shard = ShardRecord("gallery", 0, 30, "p", None, uri, None, datetime(2026, 1, 1, tzinfo=timezone.utc))
    router = SearchRouter("c", {"p": parent, "c": loaded}, {"p": None, "c": "p"}, [shard], None, ShardIndex.load)
    assert router.paths() == {"p": "queries mapped by the backward adapter"}
    result = router.search(queries, 6)

    fitted = child.adapters[BACKWARD_ADAPTER]  # the adapter before the checkpoint, applied by hand
    order, scale = fitted.order.numpy(), fitted.scale.detach().double().numpy()
    mapped = queries.double().numpy()[:, order] * scale
    distances = Geometry("cosine").pairwise_distance(torch.from_numpy(mapped), torch.from_numpy(gallery)).numpy()
    best = np.argsort(distances, axis=1, kind="stable")[:, :6]
    np.testing.assert_array_equal(result.ids, ids[best])
    np.testing.assert_allclose(result.distances, np.take_along_axis(distances, best, axis=1), rtol=1e-5, atol=1e-6)


def test_an_unregistered_adapter_is_refused_at_save_and_an_unknown_kind_at_load(generations, tmp_path):
    _child, loaded, _parent, _card, _loaded_card, folder = generations
    method = create_method("test_scaled_permutation")
    unregistered = copy.deepcopy(loaded)
    unregistered.adapters[BACKWARD_ADAPTER] = nn.Linear(8, 8)
    with pytest.raises(ValueError, match="cannot checkpoint adapter 'backward': Linear is not a registered adapter"):
        save_generation(unregistered, method, None, str(tmp_path / "x"), name="x")
    raw = json.loads((folder / "c" / "card.json").read_text())
    raw["adapters"][BACKWARD_ADAPTER]["kind"] = "nosuch"
    (tmp_path / "card.json").write_text(json.dumps(raw))
    (tmp_path / "model.safetensors").write_bytes((folder / "c" / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="unknown adapter kind 'nosuch'.*test_scaled_permutation"):
        load_generation(str(tmp_path))


def test_a_second_class_cannot_take_a_registered_kind(plugin):
    class Other(plugin[0]):
        kind = "test_scaled_permutation"

    with pytest.raises(ValueError, match="already registered"):
        register_adapter(Other)
    with pytest.raises(ValueError, match="attribute 'kind'"):
        register_adapter(type("NoKind", (nn.Module,), {}))
