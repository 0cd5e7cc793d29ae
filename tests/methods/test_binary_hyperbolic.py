"""binary_hyperbolic method: fixed Poincaré simplex prototypes, distance softmax, lifelong anchors."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from orchestrator.geometry import poincare
from orchestrator.methods.base import TrainContext
from orchestrator.methods.binary_hyperbolic import BinaryHyperbolic
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.outputs import ModelOutput
from vector_models import vector_model


def make_model(method, in_dim: int = 10, embed_dim: int = 8, num_classes: int = 3, seed: int = 0) -> CompatibleModel:
    return vector_model(method, in_dim, embed_dim, num_classes, seed)


def make_ctx(new_model, old_model) -> TrainContext:
    data = TensorDataset(torch.zeros(1, 10), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    return TrainContext(new_model=new_model, old_model=old_model, train_data=data, num_classes=new_model.num_classes)


def poincare_distance_np(x: np.ndarray, y: np.ndarray, c: float) -> np.ndarray:
    """Pairwise arcosh form (binary_hyperbolic.md §2.1), float64: (N, d), (M, d) -> (N, M)."""
    diff = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
    denom = (1 - c * (x**2).sum(1))[:, None] * (1 - c * (y**2).sum(1))[None, :]
    return np.arccosh(1 + 2 * c * diff / denom) / math.sqrt(c)


def test_defaults_and_space():
    method = BinaryHyperbolic()
    p = method.params
    assert (p.curv, p.prototype_radius, p.num_prototypes, p.temperature, p.lam) == (0.1, 1.0, None, 1.0, 0.0)
    assert method.space.value == "poincare" and not BinaryHyperbolic.requires_parent
    lift = method.build_lift()
    assert lift.space.value == "poincare" and lift.curv == 0.1


def test_prototypes_are_equidistant_simplex_vertices_at_radius():
    method = BinaryHyperbolic({"num_prototypes": 6, "prototype_radius": 1.5})
    head = method.build_head(embed_dim=8, num_classes=6)
    protos = head.prototypes.double().numpy()
    np.testing.assert_allclose(np.linalg.norm(protos, axis=1), 1.5, rtol=1e-6)
    np.testing.assert_array_equal(protos[:, 5:], 0.0)  # K-1 = 5 simplex coordinates, zero padding
    cos = protos @ protos.T / 1.5**2
    np.testing.assert_allclose(cos[~np.eye(6, dtype=bool)], -1 / 5, atol=1e-6)
    d = poincare_distance_np(protos, protos, 0.1)
    off_diagonal = d[~np.eye(6, dtype=bool)]
    # closed form: ||p_i - p_j||^2 = 2 r^2 (1 + 1/(K-1)) for unit-cosine -1/(K-1)
    chord_sq = 2 * 1.5**2 * (1 + 1 / 5)
    expected = np.arccosh(1 + 2 * 0.1 * chord_sq / (1 - 0.1 * 1.5**2) ** 2) / math.sqrt(0.1)
    np.testing.assert_allclose(off_diagonal, expected, rtol=1e-5)


def test_logits_are_negative_distances_and_argmax_is_nearest_prototype():
    method = BinaryHyperbolic({"num_prototypes": 5})
    head = method.build_head(embed_dim=6, num_classes=5)
    torch.manual_seed(0)
    points = poincare.expmap0(torch.randn(64, 6) * 1.5, 0.1)
    logits = head(points)
    d = poincare_distance_np(points.double().numpy(), head.prototypes.double().numpy(), 0.1)
    np.testing.assert_allclose(logits.double().numpy(), -d, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(logits.argmax(1).numpy(), d.argmin(1))


def test_same_num_prototypes_gives_bit_identical_anchors():
    a = BinaryHyperbolic({"num_prototypes": 10}).build_head(embed_dim=12, num_classes=10)
    b = BinaryHyperbolic({"num_prototypes": 10}).build_head(embed_dim=12, num_classes=10)
    assert torch.equal(a.prototypes, b.prototypes)
    # an earlier generation with fewer classes holds exactly the first rows of the same simplex
    early = BinaryHyperbolic({"num_prototypes": 10}).build_head(embed_dim=12, num_classes=4)
    assert early.num_classes == 4
    assert torch.equal(early.prototypes, a.prototypes[:4])
    # default: K = the generation's class count
    assert BinaryHyperbolic().build_head(embed_dim=12, num_classes=7).prototypes.shape == (7, 12)


def test_validation_errors_name_the_values():
    with pytest.raises(ValueError, match="prototype_radius"):
        BinaryHyperbolic({"curv": 0.1, "prototype_radius": math.sqrt(10.0)})
    BinaryHyperbolic({"curv": 0.1, "prototype_radius": 3.1})  # just inside 1/sqrt(0.1) = 3.162
    with pytest.raises(ValueError, match="num_prototypes=4.*num_classes=5"):
        BinaryHyperbolic({"num_prototypes": 4}).build_head(embed_dim=8, num_classes=5)
    with pytest.raises(ValueError, match="embed_dim=8.*num_prototypes=12"):
        BinaryHyperbolic({"num_prototypes": 12}).build_head(embed_dim=8, num_classes=5)
    with pytest.raises(ValueError):
        BinaryHyperbolic({"margin": 1.0})


def test_base_loss_is_cross_entropy_over_scaled_negative_distances():
    method = BinaryHyperbolic({"temperature": 0.5})
    head = method.build_head(embed_dim=4, num_classes=3)
    torch.manual_seed(1)
    emb = poincare.expmap0(torch.randn(10, 4), 0.1)
    labels = torch.arange(10) % 3
    out = ModelOutput(emb, emb, head(emb))
    terms = method.loss(out, None, labels, ctx=None)
    assert set(terms) == {"base"}
    d = torch.tensor(poincare_distance_np(emb.double().numpy(), head.prototypes.double().numpy(), 0.1))
    expected = F.cross_entropy(-d / 0.5, labels)
    np.testing.assert_allclose(terms["base"].item(), expected.item(), rtol=1e-5)
    # lam = 0 (default): no alignment term even with a parent
    assert set(method.loss(out, out, labels, ctx=None)) == {"base"}


def test_alignment_term_is_weighted_mean_poincare_distance():
    method = BinaryHyperbolic({"lam": 0.4})
    head = method.build_head(embed_dim=4, num_classes=3)
    torch.manual_seed(2)
    new_emb = poincare.expmap0(torch.randn(10, 4), 0.1).requires_grad_(True)
    old_emb = poincare.expmap0(torch.randn(10, 4), 0.1)
    labels = torch.arange(10) % 3
    terms = method.loss(ModelOutput(new_emb, new_emb, head(new_emb)), ModelOutput(old_emb, old_emb), labels, ctx=None)
    d = poincare_distance_np(new_emb.detach().double().numpy(), old_emb.double().numpy(), 0.1)
    np.testing.assert_allclose(terms["alignment"].item(), 0.4 * np.diag(d).mean(), rtol=1e-5)
    terms["alignment"].backward()
    assert torch.isfinite(new_emb.grad).all() and new_emb.grad.abs().sum() > 0


def test_training_a_linear_model_reaches_high_accuracy():
    torch.manual_seed(0)
    centres = torch.randn(3, 10) * 2.0
    labels = torch.arange(90) % 3
    x = centres[labels] + torch.randn(90, 10)
    method = BinaryHyperbolic()
    model = make_model(method, in_dim=10, embed_dim=8, num_classes=3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(60):
        terms = method.loss(model(x), None, labels, ctx=None)
        loss = sum(terms.values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(later <= earlier + 1e-6 for earlier, later in zip(losses[:5], losses[1:6]))
    with torch.no_grad():
        accuracy = (model(x).logits.argmax(1) == labels).float().mean().item()
    assert accuracy > 0.9
    assert all(not p.requires_grad for p in model.head.parameters())  # the prototypes stay fixed


def test_parent_checks():
    new_method = BinaryHyperbolic({"num_prototypes": 6})
    new_model = make_model(new_method, num_classes=5)
    compatible_parent = make_model(BinaryHyperbolic({"num_prototypes": 6}), num_classes=3, seed=1)
    new_method.on_train_start(make_ctx(new_model, compatible_parent))
    moved = make_model(BinaryHyperbolic({"num_prototypes": 3}), num_classes=3, seed=1)
    with pytest.raises(ValueError, match="prototypes differ"):
        new_method.on_train_start(make_ctx(new_model, moved))
    other_curv = make_model(BinaryHyperbolic({"num_prototypes": 6, "curv": 0.2}), num_classes=3, seed=1)
    with pytest.raises(ValueError, match=r"parent curv=0\.2.*new curv=0\.1"):
        new_method.on_train_start(make_ctx(new_model, other_curv))
