"""Poincaré-ball primitives (binary_hyperbolic.md §2.1) against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from orchestrator.geometry import poincare

CURVATURES = [0.1, 0.5, 1.0, 2.0]


def _ball_points(n: int, d: int, curv: float, seed: int, dtype=torch.float64) -> torch.Tensor:
    """Random points with squared norms spread over (0, 0.98/curv)."""
    gen = torch.Generator().manual_seed(seed)
    directions = torch.nn.functional.normalize(torch.randn(n, d, generator=gen, dtype=dtype), dim=-1)
    radii = torch.rand(n, 1, generator=gen, dtype=dtype).sqrt() * math.sqrt(0.98 / curv)
    return directions * radii


def _mobius_distance(x: torch.Tensor, y: torch.Tensor, curv: float) -> torch.Tensor:
    """binary_hyperbolic.md eq. 20: (2/sqrt c) artanh(sqrt(c) ||(-x) (+)_c y||)."""
    return 2.0 / math.sqrt(curv) * torch.atanh(math.sqrt(curv) * poincare.mobius_add(-x, y, curv).norm(dim=-1))


@pytest.mark.parametrize("curv", CURVATURES)
def test_arcosh_form_equals_mobius_form_and_geoopt(curv):
    import geoopt

    x, y = _ball_points(64, 10, curv, seed=0), _ball_points(64, 10, curv, seed=1)
    d = poincare.distance(x, y, curv)
    torch.testing.assert_close(d, _mobius_distance(x, y, curv), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(d, geoopt.PoincareBall(c=torch.tensor(curv, dtype=torch.float64)).dist(x, y), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(poincare.distance(y, x, curv), d)
    assert poincare.distance(x, x, curv).abs().max() < 1e-12


def test_distance_from_origin_is_the_integral_of_the_metric():
    """d(0, r e) = integral_0^r lambda_t dt with lambda_t = 2 / (1 - c t^2) (metric of eq. 18-19)."""
    for curv in CURVATURES:
        radius = 0.9 / math.sqrt(curv)
        t = np.linspace(0.0, radius, 200001)
        integral = np.trapezoid(2.0 / (1.0 - curv * t**2), t)
        point = torch.tensor([[0.0, radius, 0.0]], dtype=torch.float64)
        d = poincare.distance(torch.zeros_like(point), point, curv).item()
        assert d == pytest.approx(integral, rel=1e-8)


def test_small_curvature_limit_is_twice_the_euclidean_distance():
    """As c -> 0, lambda_x -> 2, so d_c(x, y) -> 2 ||x - y|| for this metric (not ||x - y||)."""
    x = torch.tensor([[0.3, -0.2, 0.5]], dtype=torch.float64)
    y = torch.tensor([[-0.1, 0.4, 0.2]], dtype=torch.float64)
    euclidean = (x - y).norm().item()
    errors = [abs(poincare.distance(x, y, c).item() - 2.0 * euclidean) for c in (1e-2, 1e-4, 1e-6)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-5 * euclidean


@pytest.mark.parametrize("curv", CURVATURES)
def test_pairwise_equals_elementwise(curv):
    x, y = _ball_points(30, 6, curv, seed=2), _ball_points(20, 6, curv, seed=3)
    pairwise = poincare.pairwise_distance(x, y, curv)
    brute = poincare.distance(x[:, None, :], y[None, :, :], curv)
    assert pairwise.shape == (30, 20)
    torch.testing.assert_close(pairwise, brute, rtol=1e-9, atol=1e-9)
    x32, y32 = x.float(), y.float()
    torch.testing.assert_close(
        poincare.pairwise_distance(x32, y32, curv), brute.float(), rtol=1e-3, atol=1e-3
    )


@pytest.mark.parametrize("curv", CURVATURES)
def test_expmap0_logmap0_round_trip_and_geodesic_length(curv):
    gen = torch.Generator().manual_seed(4)
    v = torch.randn(40, 8, generator=gen, dtype=torch.float64) * 0.8
    p = poincare.expmap0(v, curv)
    assert (p.pow(2).sum(-1) < 1.0 / curv).all()
    torch.testing.assert_close(poincare.logmap0(p, curv), v)
    # the Riemannian norm of v at 0 is lambda_0 ||v|| = 2 ||v||
    torch.testing.assert_close(poincare.distance(torch.zeros_like(p), p, curv), 2.0 * v.norm(dim=-1))


def test_mobius_addition_identities():
    curv = 0.7
    x, y = _ball_points(25, 5, curv, seed=5), _ball_points(25, 5, curv, seed=6)
    zeros = torch.zeros_like(x)
    torch.testing.assert_close(poincare.mobius_add(x, zeros, curv), x)
    torch.testing.assert_close(poincare.mobius_add(zeros, y, curv), y)
    torch.testing.assert_close(poincare.mobius_add(x, -x, curv), zeros)
    xy, x2, y2 = (x * y).sum(-1), (x * x).sum(-1), (y * y).sum(-1)
    expected = (x2 + 2 * xy + y2) / (1 + 2 * curv * xy + curv**2 * x2 * y2)  # eq. 26
    torch.testing.assert_close(poincare.mobius_add(x, y, curv).pow(2).sum(-1), expected)


@pytest.mark.parametrize("curv", CURVATURES)
def test_clip_to_ball_keeps_the_margin(curv):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(100, 4, generator=gen) * 3.0 / math.sqrt(curv)
    clipped = poincare.clip_to_ball(x, curv, eps=1e-3)
    assert (clipped.pow(2).sum(-1) <= (1 - 1e-3) / curv * (1 + 1e-6)).all()
    inside = clipped.pow(2).sum(-1) < (1 - 1e-3) / curv * (1 - 1e-6)
    torch.testing.assert_close(clipped[inside], x[inside])
    # direction is preserved
    torch.testing.assert_close(
        torch.nn.functional.normalize(clipped, dim=-1), torch.nn.functional.normalize(x, dim=-1)
    )


def _assert_finite_grads(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all(), tensor.grad


def test_float32_gradients_are_finite_at_the_edges():
    v = torch.tensor([[0.0, 0.0, 0.0], [1e4, 0.0, 0.0], [1e-20, 0.0, 0.0], [0.3, -0.2, 0.1]], requires_grad=True)
    p = poincare.expmap0(v, 1.0)
    assert torch.isfinite(p).all()
    total = (
        poincare.distance(p, p, 1.0).sum()
        + poincare.distance(p, p.flip(0), 1.0).sum()
        + poincare.pairwise_distance(p, p, 1.0).sum()
        + poincare.logmap0(p, 1.0).sum()
        + poincare.mobius_add(p, p.flip(0), 1.0).sum()
        + poincare.clip_to_ball(p, 1.0).sum()
    )
    assert torch.isfinite(total)
    total.backward()
    _assert_finite_grads(v)
    v0 = torch.zeros(3, requires_grad=True)
    poincare.expmap0(v0, 1.0).sum().backward()
    torch.testing.assert_close(v0.grad, torch.ones(3))


def test_learnable_curvature_gets_the_finite_difference_gradient():
    x, y = _ball_points(5, 3, 1.0, seed=8) * 0.8, _ball_points(5, 3, 1.0, seed=9) * 0.8
    curv = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)

    def objective(c):
        p = poincare.expmap0(poincare.logmap0(x, 1.0), c)
        return poincare.distance(p, y, c).sum() + poincare.pairwise_distance(p, y, c).sum()

    assert torch.autograd.gradcheck(objective, (curv,))
    curv32 = torch.tensor(1.0, requires_grad=True)
    poincare.pairwise_distance(x.float(), y.float(), curv32).sum().backward()
    assert torch.isfinite(curv32.grad) and curv32.grad != 0


def test_gradcheck_distance_in_float64():
    x = _ball_points(4, 3, 1.0, seed=10).requires_grad_(True)
    y = _ball_points(4, 3, 1.0, seed=11).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: poincare.distance(a, b, 1.0), (x, y))


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="eps"):
        poincare.clip_to_ball(torch.zeros(2, 3), 1.0, eps=1.5)
    with pytest.raises(ValueError, match="curv"):
        poincare.distance(torch.zeros(2, 3), torch.zeros(2, 3), -1.0)
