"""λ-orthogonality adapters: contrastive loss, λ gate, B_⊥ / B_λ fitting, backfill order (lambda_orthogonality.md §2)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from orchestrator.geometry.spaces import Space
from orchestrator.methods.base import TrainContext
from orchestrator.methods.lambda_orth import (
    BACKWARD_ADAPTER,
    FORWARD_ADAPTER,
    EmbeddingMap,
    LambdaOrthogonality,
    LambdaOrthParams,
    adapter_losses,
    backfill_order,
    backward_matrix,
    backward_transform,
    fit_compatibility_adapters,
    forward_transform,
    multi_positive_contrastive,
    procrustes_rotation,
    rotation_log,
)
from orchestrator.methods.registry import method_class
from orchestrator.metrics import retrieval_metrics
from orchestrator.models.adapters import AffineAdapter, OrthogonalAdapter, truncate_to_common
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.heads import LinearHead
from orchestrator.models.lifts import CosineLift
from orchestrator.models.outputs import ModelOutput


def _rotation(n: int, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A random proper rotation (det +1), (n, n)."""
    q = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64)).Q
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q.to(dtype)


def _clusters(n_items: int, dim: int, classes: int, spread: float, generator: torch.Generator):
    labels = torch.arange(n_items) % classes
    centers = torch.randn(classes, dim, generator=generator)
    return centers[labels] + spread * torch.randn(n_items, dim, generator=generator), labels


def _top1(queries, gallery, labels, space="cosine") -> float:
    ids = torch.arange(labels.numel())
    return retrieval_metrics(queries, gallery, labels, labels, space, ks=(1,), query_ids=ids, gallery_ids=ids).cmc[1]


def test_registered_as_parent_aligned_ce_method():
    method = method_class("lambda_orth")()
    assert isinstance(method, LambdaOrthogonality) and method.requires_parent is True
    assert method.space is Space.COSINE
    assert isinstance(method.build_head(8, 5), LinearHead)
    logits = torch.randn(4, 5)
    labels = torch.tensor([0, 1, 2, 3])
    out = ModelOutput(torch.randn(4, 8), torch.randn(4, 8), logits)
    terms = method.loss(out, None, labels, ctx=None)
    assert set(terms) == {"base"}
    torch.testing.assert_close(terms["base"], F.cross_entropy(logits, labels))


def test_multi_positive_contrastive_matches_eq8_brute_force():
    g = torch.Generator().manual_seed(0)
    anchors, candidates = torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randn(6, 4, generator=g, dtype=torch.float64)
    anchor_labels = torch.tensor([0, 1, 2, 0, 7])  # label 7 has no candidate: left out of the mean
    candidate_labels = torch.tensor([0, 0, 1, 2, 2, 1])
    tau = 0.1
    losses = []
    for i in range(5):
        a = anchors[i] / anchors[i].norm()
        sims = [float(a @ (c / c.norm())) / tau for c in candidates]
        log_z = math.log(sum(math.exp(s) for s in sims))
        positives = [j for j in range(6) if candidate_labels[j] == anchor_labels[i]]
        if positives:
            losses.append(-sum(sims[j] - log_z for j in positives) / len(positives))
    got = multi_positive_contrastive(anchors, candidates, anchor_labels, candidate_labels, tau)
    assert got.item() == pytest.approx(sum(losses) / len(losses), rel=1e-10)
    none = multi_positive_contrastive(anchors, candidates, torch.full((5,), 9), candidate_labels, tau)
    assert none.item() == 0.0
    with pytest.raises(ValueError, match="anchor_labels"):
        multi_positive_contrastive(anchors, candidates, anchor_labels[:3], candidate_labels, tau)


@pytest.mark.parametrize(("scale", "deviation", "gate"), [(1.5, 5.0, 0.0), (2.0, 12.0, 0.5), (2.5, 21.0, 1.0)])
def test_lambda_gate_switches_off_below_lambda(scale, deviation, gate):
    """L_λ = σ(α(D − λ))·D (eq. 6) with W = s·I in 16 dims: D = (s² − 1)·√16."""
    n = 16
    params = LambdaOrthParams(space="euclidean", variant="lambda", lam=12.0)
    adapter = AffineAdapter(n, n)
    with torch.no_grad():
        adapter.weight.mul_(scale)
    backward = EmbeddingMap(adapter, normalize_input=False)
    forward = EmbeddingMap(AffineAdapter(n, n), normalize_input=False)
    x, labels = torch.randn(8, n), torch.arange(8) % 2
    terms = adapter_losses(backward, forward, x, x, labels, params)
    assert terms["lambda"].item() == pytest.approx(gate * deviation, abs=1e-4)


def test_orthogonal_log_and_procrustes_recover_a_rotation():
    g = torch.Generator().manual_seed(1)
    rotation = _rotation(24, g, torch.float64)
    torch.testing.assert_close(torch.linalg.matrix_exp(rotation_log(rotation)), rotation, atol=1e-10, rtol=0)
    new = torch.randn(200, 24, generator=g, dtype=torch.float64)
    torch.testing.assert_close(procrustes_rotation(new @ rotation.T, new), rotation, atol=1e-8, rtol=0)


def test_b_perp_recovers_a_rotation_and_stays_orthogonal():
    """New space = random rotation of the old one + small noise: B(new) ≈ old, B(new)/old ≈ old/old."""
    g = torch.Generator().manual_seed(2)
    old, labels = _clusters(512, 16, 8, spread=0.6, generator=g)
    rotation = _rotation(16, g)
    new = old @ rotation.T + 0.01 * torch.randn(512, 16, generator=g)
    params = LambdaOrthParams(adapter_epochs=10, adapter_batch_size=128)
    backward, forward, history = fit_compatibility_adapters(old, new, labels, params, torch.Generator().manual_seed(0))

    matrix = backward_matrix(backward).detach()
    assert isinstance(backward.map, OrthogonalAdapter) and isinstance(forward.map, AffineAdapter)
    assert (matrix @ matrix.T - torch.eye(16)).abs().max() < 1e-5
    assert len(history) == 10 and {"loss/forward", "loss/backward", "loss/contrastive"} <= set(history[-1])
    with torch.no_grad():
        mapped = backward(new)
    assert (mapped - F.normalize(old, dim=1)).pow(2).sum(dim=1).mean() < 5e-3  # unit vectors: 2 for random pairs
    old_old = _top1(old, old, labels)
    assert _top1(new, old, labels) < 0.3  # naive cross retrieval is broken
    assert _top1(mapped, old, labels) >= old_old - 0.01
    # B_⊥ is an isometry: new/new retrieval is unchanged
    assert _top1(mapped, mapped, labels) == _top1(new, new, labels)


def test_b_lambda_deviation_settles_near_lambda():
    """Target map 3× scaling: the unregularised optimum W = 3I has D = 8·√32 ≈ 45 ≫ λ = 12 (Table 12: ≈ 12.05)."""
    g = torch.Generator().manual_seed(3)
    new, labels = _clusters(512, 32, 8, spread=0.5, generator=g)
    old = 3.0 * new

    def final_deviation(lam: float) -> float:
        params = LambdaOrthParams(space="euclidean", variant="lambda", lam=lam, adapter_epochs=20,
                                  adapter_batch_size=64, adapter_lr=3e-3)
        backward, _, history = fit_compatibility_adapters(old, new, labels, params, torch.Generator().manual_seed(0))
        assert isinstance(backward.map, AffineAdapter)
        return history[-1]["gram_deviation"]

    assert 11.0 < final_deviation(12.0) < 12.5
    assert final_deviation(1000.0) > 15.0  # without an active gate the same budget runs past λ


@pytest.mark.parametrize(("old_dim", "new_dim"), [(8, 12), (12, 8)])
def test_different_dimensions_use_the_common_prefix(old_dim, new_dim):
    g = torch.Generator().manual_seed(4)
    m = min(old_dim, new_dim)
    old, labels = _clusters(384, old_dim, 6, spread=0.5, generator=g)
    rotation = _rotation(m, g)
    new = torch.cat([old[:, :m] @ rotation.T, 0.05 * torch.randn(384, new_dim - m, generator=g)], dim=1)
    params = LambdaOrthParams(space="euclidean", adapter_epochs=5, adapter_batch_size=128)
    backward, forward, _ = fit_compatibility_adapters(old, new, labels, params, torch.Generator().manual_seed(0))
    with torch.no_grad():
        mapped, upgraded = backward(new), forward(old)
    assert mapped.shape == (384, new_dim) and upgraded.shape == (384, new_dim)
    query, gallery = truncate_to_common(mapped, old)
    assert query.shape == gallery.shape == (384, m)
    baseline = (old[:, :m]).pow(2).sum(dim=1).mean()
    assert (query - gallery).pow(2).sum(dim=1).mean() < 0.02 * baseline
    assert _top1(query, gallery, labels, "euclidean") >= _top1(old[:, :m], old[:, :m], labels, "euclidean") - 0.02


def test_backfill_order_puts_the_least_representative_items_first():
    embeddings = torch.tensor([
        [1.0, 0.0], [3.0, 0.0], [2.0, 0.0],     # class 5: mean (2, 0); distances 1, 1, 0
        [0.0, 10.0], [0.0, 14.0], [0.0, 0.0],   # class 9: mean (0, 8); distances 2, 6, 8
    ])
    labels = torch.tensor([5, 5, 5, 9, 9, 9])
    assert backfill_order(embeddings, labels).tolist() == [5, 4, 3, 0, 1, 2]  # ties keep gallery order
    cosine = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [5.0, 0.0]])
    # class mean (1.75, 0.5): the item at 90° to the mean is the least representative
    assert backfill_order(cosine, torch.zeros(4, dtype=torch.long), "cosine").tolist()[0] == 1
    with pytest.raises(ValueError, match="distance"):
        backfill_order(embeddings, labels, "hamming")


class _LinearEncoder(nn.Module):
    """Images (B, 3, 2, 2) -> fixed linear map -> cosine lift (no timm, for a fast hook test)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight)
        self.lift = CosineLift()

    def forward(self, images: torch.Tensor) -> ModelOutput:
        features, embedding = self.lift(images.flatten(1) @ self.weight.T)
        return ModelOutput(features, embedding)


def test_on_train_end_fits_and_stores_the_adapters_against_the_parents_published_space():
    g = torch.Generator().manual_seed(5)
    inputs, labels = _clusters(256, 12, 4, spread=0.4, generator=g)
    data = TensorDataset(inputs.view(256, 3, 2, 2), labels, torch.arange(256))
    old_weight = torch.randn(10, 12, generator=g)
    parent = CompatibleModel(_LinearEncoder(old_weight), LinearHead(10, 4), seen_classes=range(4))
    # the parent is itself a lambda_orth generation: its published space is S·h (a fixed rotation)
    parent_map = OrthogonalAdapter(10)
    with torch.no_grad():
        parent_map.upper.normal_(0.0, 0.3, generator=g)
    parent.adapters[BACKWARD_ADAPTER] = EmbeddingMap(parent_map, normalize_input=True)
    rotation = _rotation(10, g)
    child = CompatibleModel(_LinearEncoder(rotation @ old_weight), LinearHead(10, 4), seen_classes=range(4))
    method = LambdaOrthogonality({"adapter_epochs": 5, "adapter_batch_size": 64})
    ctx = TrainContext(new_model=child, old_model=parent.eval(), train_data=data, num_classes=4)
    method.on_train_end(ctx)

    assert set(child.adapters) == {BACKWARD_ADAPTER, FORWARD_ADAPTER} == {"backward", "forward_map"}
    assert len(ctx.state["lambda_orth_history"]) == 5
    parent_out, _ = ctx.embed_train_data(parent)
    child_out, _ = ctx.embed_train_data(child)
    published = backward_transform(parent, parent_out.embedding)
    mapped = backward_transform(child, child_out.embedding)
    assert (mapped - published).pow(2).sum(dim=1).mean() < 5e-3
    assert (mapped - parent_out.embedding).pow(2).sum(dim=1).mean() > 0.1  # not the raw parent space
    assert forward_transform(child, published).shape == (256, 10)
    plain = CompatibleModel(_LinearEncoder(old_weight), LinearHead(10, 4), seen_classes=range(4))
    assert torch.equal(backward_transform(plain, published), published)  # no adapter: its own embedding
    with pytest.raises(ValueError, match="forward"):
        forward_transform(parent, published)


def test_on_train_end_without_parent_is_an_error():
    model = CompatibleModel(_LinearEncoder(torch.randn(4, 12)), LinearHead(4, 2), seen_classes=range(2))
    data = TensorDataset(torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 0, 1]), torch.arange(4))
    with pytest.raises(ValueError, match="parent"):
        LambdaOrthogonality().on_train_end(TrainContext(new_model=model, old_model=None, train_data=data, num_classes=2))
