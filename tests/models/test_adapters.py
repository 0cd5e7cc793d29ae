"""Adapters: B_perp orthogonality, affine init, λ-orthogonality penalty (lambda_orthogonality eq. 6)."""
from __future__ import annotations

import math

import pytest
import torch

from orchestrator.models.adapters import (
    AffineAdapter,
    EmbeddingMap,
    MLPAdapter,
    OrthogonalAdapter,
    adapter_spec,
    build_adapter,
    gram_deviation,
    lambda_orthogonality_penalty,
    truncate_to_common,
)


def _orthogonality_error(matrix: torch.Tensor) -> float:
    eye = torch.eye(matrix.shape[0], dtype=matrix.dtype)
    matrix = matrix.detach()
    return float((matrix @ matrix.T - eye).abs().max())


def test_orthogonal_adapter_starts_at_identity():
    adapter = OrthogonalAdapter(6)
    assert adapter.upper.numel() == 15
    torch.testing.assert_close(adapter.matrix, torch.eye(6))
    x = torch.randn(3, 6)
    torch.testing.assert_close(adapter(x), x)


def test_orthogonal_adapter_random_u_is_orthogonal_and_matches_expm():
    torch.manual_seed(0)
    adapter = OrthogonalAdapter(8)
    with torch.no_grad():
        adapter.upper.normal_(0.0, 1.0)
    matrix = adapter.matrix
    assert _orthogonality_error(matrix) < 1e-5
    # reference: build the skew matrix independently and exponentiate in float64
    u = torch.zeros(8, 8, dtype=torch.float64)
    u[torch.triu(torch.ones(8, 8, dtype=torch.bool), diagonal=1)] = adapter.upper.detach().double()
    torch.testing.assert_close(matrix.double(), torch.linalg.matrix_exp(u - u.T), atol=1e-5, rtol=1e-5)
    x = torch.randn(5, 8)
    torch.testing.assert_close(adapter(x).norm(dim=1), x.norm(dim=1), atol=1e-5, rtol=1e-5)


def test_orthogonal_adapter_stays_orthogonal_under_training():
    torch.manual_seed(0)
    adapter = OrthogonalAdapter(8)
    target = torch.randn(64, 8)
    source = torch.randn(64, 8)
    optimizer = torch.optim.Adam(adapter.parameters(), lr=0.1)
    losses = []
    for _ in range(20):
        loss = ((adapter(source) - target) ** 2).sum(dim=1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    assert _orthogonality_error(adapter.matrix.detach()) < 1e-5


def test_affine_adapter_identity_and_default_init():
    square = AffineAdapter(5, 5)
    torch.testing.assert_close(square.weight, torch.eye(5))
    assert torch.equal(square.bias, torch.zeros(5))
    assert gram_deviation(square.weight).item() < 1e-5
    wide = AffineAdapter(6, 4)
    x = torch.randn(3, 6)
    torch.testing.assert_close(wide(x), x[:, :4])
    default = AffineAdapter(5, 5, init="default")
    assert not torch.allclose(default.weight, torch.eye(5))
    with pytest.raises(ValueError, match="init"):
        AffineAdapter(5, 5, init="orthogonal")


def test_gram_deviation_value_and_finite_gradient_at_orthogonal():
    torch.manual_seed(0)
    w = torch.randn(4, 4, dtype=torch.float64)
    expected = torch.linalg.matrix_norm(w @ w.T - torch.eye(4, dtype=torch.float64))
    assert float(gram_deviation(w)) == pytest.approx(float(expected), rel=1e-10)
    eye = torch.eye(4, requires_grad=True)
    gram_deviation(eye).backward()
    assert torch.isfinite(eye.grad).all()


def test_lambda_penalty_gate_is_off_below_lambda_and_on_above():
    torch.manual_seed(0)
    near_orthogonal = torch.eye(6) + 0.01 * torch.randn(6, 6)
    far = 3.0 * torch.randn(6, 6)
    lam, alpha = 5.0, 10.0
    d_small = float(gram_deviation(near_orthogonal))
    d_large = float(gram_deviation(far))
    assert d_small < 0.2 and d_large > 20.0
    small = float(lambda_orthogonality_penalty(near_orthogonal, lam, alpha))
    large = float(lambda_orthogonality_penalty(far, lam, alpha))
    assert small == pytest.approx(d_small / (1.0 + math.exp(-alpha * (d_small - lam))), rel=1e-5)
    assert small < 1e-20
    assert large == pytest.approx(d_large, rel=1e-6)
    # not a hinge: at D slightly above λ the penalty is about D, not D - λ
    assert float(lambda_orthogonality_penalty(far, d_large - 1.0, alpha)) == pytest.approx(d_large, rel=1e-3)


@pytest.mark.parametrize("scale", [0.3, 1.0, 3.0])
def test_lambda_penalty_gradient_step_reduces_deviation(scale):
    torch.manual_seed(0)
    w = (scale * torch.randn(6, 6, dtype=torch.float64)).requires_grad_(True)
    before = gram_deviation(w).item()
    lambda_orthogonality_penalty(w, lam=float(before) * 0.9, alpha=2.0).backward()
    with torch.no_grad():
        stepped = w - 1e-4 * w.grad
    assert float(gram_deviation(stepped)) < before


def test_lambda_penalty_validates_arguments():
    with pytest.raises(ValueError, match="lam"):
        lambda_orthogonality_penalty(torch.eye(2), lam=-1.0, alpha=1.0)
    with pytest.raises(ValueError, match="alpha"):
        lambda_orthogonality_penalty(torch.eye(2), lam=1.0, alpha=0.0)


def test_truncate_to_common_keeps_prefix():
    a, b = torch.randn(3, 10), torch.randn(3, 4)
    ta, tb = truncate_to_common(a, b)
    assert torch.equal(ta, a[:, :4]) and torch.equal(tb, b)


@pytest.mark.parametrize("module, spec", [
    (OrthogonalAdapter(5), {"kind": "orthogonal", "dim": 5}),
    (AffineAdapter(4, 6, bias=False), {"kind": "affine", "in_dim": 4, "out_dim": 6, "bias": False}),
    (MLPAdapter(4, 6, 9), {"kind": "mlp", "in_dim": 4, "out_dim": 6, "hidden_dim": 9}),
    (EmbeddingMap(AffineAdapter(3, 5), True),
     {"kind": "embedding_map", "normalize_input": True, "map": {"kind": "affine", "in_dim": 3, "out_dim": 5, "bias": True}}),
])
def test_every_built_in_kind_describes_itself_and_is_rebuilt_with_the_same_structure(module, spec):
    assert adapter_spec(module) == spec
    rebuilt = build_adapter(spec)
    assert type(rebuilt) is type(module)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn_like(parameter))  # weights away from any initialisation
    state = module.state_dict()
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in state.items()}
    rebuilt.load_state_dict(state, strict=True)
    x = torch.randn(2, rebuilt_input_dim(spec))
    torch.testing.assert_close(rebuilt(x), module(x), rtol=0, atol=0)


def rebuilt_input_dim(spec):
    inner = spec.get("map", spec)
    return inner.get("dim", inner.get("in_dim"))


def test_an_adapter_spec_needs_a_registered_kind():
    with pytest.raises(ValueError, match="unknown adapter kind 'nosuch'; known kinds: .*affine"):
        build_adapter({"kind": "nosuch"})
    with pytest.raises(ValueError, match="mapping with a 'kind'"):
        build_adapter({"dim": 3})
    with pytest.raises(ValueError, match="Linear is not a registered adapter kind"):
        adapter_spec(torch.nn.Linear(2, 2))
