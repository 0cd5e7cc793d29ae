"""Lorentz-model primitives (HBCT §2, §5, §6) against float64 / brute-force references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from orchestrator.geometry import lorentz, poincare

CURVATURES = [0.1, 0.5, 1.0, 2.0]


def _tangent_vectors(n: int, d: int, max_norm: float, seed: int, dtype=torch.float64) -> torch.Tensor:
    """Random (n, d) vectors with norms spread uniformly in (0, max_norm]."""
    gen = torch.Generator().manual_seed(seed)
    directions = torch.nn.functional.normalize(torch.randn(n, d, generator=gen, dtype=dtype), dim=-1)
    norms = max_norm * (torch.arange(1, n + 1, dtype=dtype) / n)
    return directions * norms[:, None]


def _reference_distance(x: np.ndarray, y: np.ndarray, curv: float) -> np.ndarray:
    """HBCT eq. 3 literally, in float64 numpy."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    lorentz_inner = (x[..., 1:] * y[..., 1:]).sum(-1) - x[..., 0] * y[..., 0]
    return np.arccosh(np.maximum(-curv * lorentz_inner, 1.0)) / math.sqrt(curv)


@pytest.mark.parametrize("curv", CURVATURES)
def test_expmap0_points_lie_on_the_hyperboloid(curv):
    v = _tangent_vectors(64, 16, max_norm=4.0, seed=0)
    x = lorentz.expmap0(v, curv)
    assert x.shape == (64, 17)
    torch.testing.assert_close(
        lorentz.inner(x, x), torch.full((64,), -1.0 / curv, dtype=torch.float64), rtol=1e-9, atol=1e-9
    )
    assert (x[:, 0] > 0).all()
    # closed form of HBCT §2: x_t = cosh(sqrt(K)|v|)/sqrt(K)
    rate = math.sqrt(curv) * v.norm(dim=-1)
    torch.testing.assert_close(x[:, 0], torch.cosh(rate) / math.sqrt(curv))


@pytest.mark.parametrize("curv", CURVATURES)
def test_logmap0_inverts_expmap0(curv):
    v = _tangent_vectors(64, 16, max_norm=5.0, seed=1)
    torch.testing.assert_close(lorentz.logmap0(lorentz.expmap0(v, curv), curv), v, rtol=1e-10, atol=1e-10)
    v32 = _tangent_vectors(64, 16, max_norm=3.0, seed=1, dtype=torch.float32)
    torch.testing.assert_close(lorentz.logmap0(lorentz.expmap0(v32, curv), curv), v32, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("curv", CURVATURES)
def test_general_maps_round_trip_at_a_non_origin_point(curv):
    gen = torch.Generator().manual_seed(2)
    p = lorentz.expmap0(_tangent_vectors(32, 8, 2.0, seed=3), curv)
    u = lorentz.project_tangent(p, torch.randn(32, 9, generator=gen, dtype=torch.float64), curv)
    torch.testing.assert_close(lorentz.inner(p, u), torch.zeros(32, dtype=torch.float64), atol=1e-10, rtol=0)
    # rescale to Lorentz norms in (0, 4] (below the asinh(2**15) cap of the exp map)
    u = u / lorentz.inner(u, u, keepdim=True).sqrt() * torch.linspace(0.1, 4.0, 32, dtype=torch.float64)[:, None]

    x = lorentz.expmap(p, u, curv)
    torch.testing.assert_close(lorentz.inner(x, x), torch.full((32,), -1.0 / curv, dtype=torch.float64))
    torch.testing.assert_close(lorentz.logmap(p, x, curv), u, rtol=1e-8, atol=1e-8)
    # the geodesic length equals the Lorentz norm of the tangent vector
    torch.testing.assert_close(lorentz.distance(p, x, curv), lorentz.inner(u, u).sqrt())

    y = lorentz.expmap0(_tangent_vectors(32, 8, 2.0, seed=4), curv)
    torch.testing.assert_close(lorentz.expmap(p, lorentz.logmap(p, y, curv), curv), y, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("curv", CURVATURES)
def test_expmap_and_logmap_at_origin_match_the_closed_forms(curv):
    v = _tangent_vectors(16, 5, 3.0, seed=5)
    o = lorentz.origin(5, curv, dtype=torch.float64).expand(16, 6)
    tangent = torch.cat([torch.zeros(16, 1, dtype=torch.float64), v], dim=-1)
    torch.testing.assert_close(lorentz.expmap(o, tangent, curv), lorentz.expmap0(v, curv))
    torch.testing.assert_close(lorentz.logmap(o, lorentz.expmap0(v, curv), curv), tangent)


def test_origin_has_time_one_over_sqrt_k():
    o = lorentz.origin(3, 4.0)
    assert o.dtype == torch.float32
    assert o.tolist() == [0.5, 0.0, 0.0, 0.0]
    curv = torch.tensor(0.25, dtype=torch.float64, requires_grad=True)
    o_t = lorentz.origin(2, curv)
    assert o_t.dtype == torch.float64 and o_t.tolist() == [2.0, 0.0, 0.0]
    o_t[0].backward()
    assert curv.grad.item() == pytest.approx(-0.5 * 0.25**-1.5)


@pytest.mark.parametrize("curv", CURVATURES)
def test_distance_matches_float64_reference_poincare_and_pairwise(curv):
    x = lorentz.expmap0(_tangent_vectors(40, 12, 3.0, seed=6, dtype=torch.float32), curv)
    y = lorentz.expmap0(_tangent_vectors(40, 12, 3.0, seed=7, dtype=torch.float32).flip(0), curv)
    d = lorentz.distance(x, y, curv)

    reference = _reference_distance(x.numpy(), y.numpy(), curv)
    np.testing.assert_allclose(d.numpy(), reference, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(lorentz.distance(y, x, curv), d)
    assert lorentz.distance(x, x, curv).abs().max() < 1e-6

    px, py = lorentz.to_poincare(x.double(), curv), lorentz.to_poincare(y.double(), curv)
    assert (px.pow(2).sum(-1) < 1.0 / curv).all()
    torch.testing.assert_close(poincare.distance(px, py, curv), d.double(), rtol=1e-4, atol=1e-4)

    pairwise = lorentz.pairwise_distance(x, y, curv)
    assert pairwise.shape == (40, 40)
    torch.testing.assert_close(pairwise.diagonal(), d, rtol=1e-4, atol=1e-4)
    brute = _reference_distance(x.numpy()[:, None, :], y.numpy()[None, :, :], curv)
    np.testing.assert_allclose(pairwise.numpy(), brute, rtol=1e-4, atol=1e-4)
    # the matmul expansion of ||x_s - y_s||^2 is accurate to ~sqrt(eps) * ||x_s|| for coincident points
    self_distance = lorentz.pairwise_distance(x, x, curv).diagonal()
    assert (self_distance <= 1e-3 * (1.0 + x[:, 1:].norm(dim=-1))).all()


def test_pairwise_inner_equals_elementwise_inner():
    x = lorentz.expmap0(_tangent_vectors(7, 4, 2.0, seed=8), 1.0)
    y = lorentz.expmap0(_tangent_vectors(5, 4, 2.0, seed=9), 1.0)
    brute = torch.stack([torch.stack([lorentz.inner(a, b) for b in y]) for a in x])
    torch.testing.assert_close(lorentz.pairwise_inner(x, y), brute)


@pytest.mark.parametrize("curv", [0.5, 2.0])
def test_triangle_inequality(curv):
    gen = torch.Generator().manual_seed(10)
    points = [lorentz.expmap0(torch.randn(500, 6, generator=gen), curv) for _ in range(3)]
    a, b, c = points
    slack = lorentz.distance(a, b, curv) + lorentz.distance(b, c, curv) - lorentz.distance(a, c, curv)
    assert slack.min() > -1e-5


def test_from_poincare_inverts_to_poincare():
    for curv in CURVATURES:
        x = lorentz.expmap0(_tangent_vectors(20, 6, 3.0, seed=11), curv)
        torch.testing.assert_close(lorentz.from_poincare(lorentz.to_poincare(x, curv), curv), x)


@pytest.mark.parametrize("curv", CURVATURES)
def test_uncertainty_is_one_minus_tanh_of_scaled_norm(curv):
    z = _tangent_vectors(50, 8, 4.0, seed=12)
    u = lorentz.uncertainty(lorentz.expmap0(z, curv), curv)
    torch.testing.assert_close(u, 1.0 - torch.tanh(math.sqrt(curv) * z.norm(dim=-1)))
    huge = lorentz.expmap0(torch.full((3, 8), 1e4), curv)
    origin = lorentz.origin(8, curv).unsqueeze(0)
    values = lorentz.uncertainty(torch.cat([huge, origin]), curv)
    assert ((values >= 0) & (values <= 1)).all()
    assert values[-1] == 1.0


def test_uncertainty_range_for_unit_clip_at_unit_curvature():
    z = _tangent_vectors(1001, 16, 1.0, seed=13)
    z = torch.cat([torch.zeros(1, 16, dtype=torch.float64), z])
    u = lorentz.uncertainty(lorentz.expmap0(z, 1.0), 1.0)
    assert u.max().item() == pytest.approx(1.0)
    assert u.min().item() == pytest.approx(1.0 - math.tanh(1.0))
    assert round(1.0 - math.tanh(1.0), 4) == 0.2384


def _angle_via_logmaps(x: torch.Tensor, y: torch.Tensor, curv: float) -> torch.Tensor:
    """Independent exterior angle: pi minus the angle at x between the log-map directions to O and y."""
    o = lorentz.origin(x.shape[-1] - 1, curv, dtype=x.dtype).expand_as(x)
    to_origin, to_child = lorentz.logmap(x, o, curv), lorentz.logmap(x, y, curv)
    cosine = lorentz.inner(to_origin, to_child) / (
        lorentz.inner(to_origin, to_origin).sqrt() * lorentz.inner(to_child, to_child).sqrt()
    )
    return math.pi - torch.acos(cosine.clamp(-1, 1))


@pytest.mark.parametrize("curv", CURVATURES)
def test_exterior_angle_matches_tangent_space_angle(curv):
    x = lorentz.expmap0(_tangent_vectors(30, 5, 2.0, seed=14) + 0.2, curv)
    y = lorentz.expmap0(_tangent_vectors(30, 5, 2.0, seed=15), curv)
    torch.testing.assert_close(lorentz.exterior_angle(x, y, curv), _angle_via_logmaps(x, y, curv))


@pytest.mark.parametrize("curv", CURVATURES)
def test_entailment_loss_zero_inside_cone_positive_outside(curv):
    z = torch.tensor([[1.0, 0.0, 0.0]])
    apex = lorentz.expmap0(z, curv)
    aperture = lorentz.half_aperture(apex, curv)
    torch.testing.assert_close(aperture, torch.asin(torch.tensor([0.2 / math.sinh(math.sqrt(curv))])))

    beyond = lorentz.expmap0(z * torch.tensor([[1.5], [3.0]]), curv)  # on the ray from O past the apex
    ext_beyond = lorentz.exterior_angle(apex.expand(2, 4), beyond, curv)
    assert ext_beyond.max() < 1e-2  # float32 acos near 1: ~sqrt(2 * 1e-6)
    assert (torch.relu(ext_beyond - aperture) == 0).all()
    ext_beyond64 = lorentz.exterior_angle(apex.double().expand(2, 4), beyond.double(), curv)
    assert ext_beyond64.max() < 1e-6

    between = lorentz.expmap0(z * 0.5, curv)  # between O and the apex: angle O-x-y is 0
    assert lorentz.exterior_angle(apex, between, curv).item() == pytest.approx(math.pi, abs=2e-3)

    rotated = lorentz.expmap0(torch.tensor([[0.0, 1.5, 0.0]]), curv)  # far off the cone axis
    loss = torch.relu(lorentz.exterior_angle(apex, rotated, curv) - aperture)
    assert loss.item() > 0.5


def test_half_aperture_matches_paper_numbers():
    apex = lorentz.expmap0(torch.tensor([[1.0, 0.0], [0.1, 0.0]]), 1.0)
    aperture = lorentz.half_aperture(apex, 1.0, min_radius=0.1)
    assert aperture[0].item() == pytest.approx(math.asin(0.2 / math.sinh(1.0)), rel=1e-6)
    assert aperture[0].item() == pytest.approx(0.1710, abs=1e-4)
    assert aperture[1].item() == pytest.approx(math.pi / 2, abs=2e-3)  # |z| < asinh(0.2): clamped


def _assert_finite_grads(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all(), tensor.grad


def test_float32_gradients_are_finite_at_the_edges():
    v = torch.tensor([[0.0, 0.0, 0.0], [1e4, 0.0, 0.0], [1e-20, 0.0, 0.0], [0.3, -0.2, 0.1]], requires_grad=True)
    points = lorentz.expmap0(v, 1.0)
    assert torch.isfinite(points).all()
    assert points[1, 1].item() == pytest.approx(2.0**15)
    total = (
        points.sum()
        + lorentz.distance(points, points, 1.0).sum()
        + lorentz.pairwise_distance(points, points, 1.0).sum()
        + lorentz.uncertainty(points, 1.0).sum()
        + lorentz.half_aperture(points, 1.0).sum()
        + lorentz.exterior_angle(points, points, 1.0).sum()
        + lorentz.exterior_angle(points, points.flip(0), 1.0).sum()
        + lorentz.logmap0(points, 1.0).sum()
        + lorentz.logmap(points, points, 1.0).sum()
        + lorentz.to_poincare(points, 1.0).sum()
    )
    assert torch.isfinite(total)
    total.backward()
    _assert_finite_grads(v)
    # d expmap0 / dv at v = 0 is the identity on the space part
    v0 = torch.zeros(3, requires_grad=True)
    lorentz.expmap0(v0, 1.0)[1:].sum().backward()
    torch.testing.assert_close(v0.grad, torch.ones(3))


def test_expmap_with_zero_tangent_is_identity_with_finite_gradient():
    p = lorentz.expmap0(torch.tensor([[0.4, 0.1]]), 1.0).detach().requires_grad_(True)
    u = torch.zeros(1, 3, requires_grad=True)
    x = lorentz.expmap(p, u, 1.0)
    torch.testing.assert_close(x, p)
    x.sum().backward()
    _assert_finite_grads(p, u)


def test_from_poincare_on_the_boundary_is_finite():
    p = torch.tensor([[1.0, 0.0], [0.6, 0.8]], requires_grad=True)
    x = lorentz.from_poincare(p, 1.0)
    assert torch.isfinite(x).all()
    x.sum().backward()
    _assert_finite_grads(p)


def test_learnable_curvature_gets_the_finite_difference_gradient():
    v = _tangent_vectors(6, 4, 1.5, seed=16)
    w = _tangent_vectors(6, 4, 1.5, seed=17).flip(0)
    curv = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)

    def objective(c):
        x, y = lorentz.expmap0(v, c), lorentz.expmap0(w, c)
        return (
            lorentz.distance(x, y, c).sum()
            + lorentz.pairwise_distance(x, y, c).sum()
            + lorentz.exterior_angle(x, y, c).sum()
            + lorentz.half_aperture(x, c).sum()
            + lorentz.uncertainty(y, c).sum()
        )

    assert torch.autograd.gradcheck(objective, (curv,))
    curv32 = torch.tensor(1.0, requires_grad=True)
    x = lorentz.expmap0(v.float(), curv32)
    lorentz.pairwise_distance(x, x, curv32).sum().backward()
    assert torch.isfinite(curv32.grad) and curv32.grad != 0


def test_gradcheck_distance_and_maps_in_float64():
    x = lorentz.expmap0(_tangent_vectors(4, 3, 1.5, seed=18), 1.3).requires_grad_(True)
    y = lorentz.expmap0(_tangent_vectors(4, 3, 1.5, seed=19).flip(0), 1.3).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: lorentz.distance(a, b, 1.3), (x, y))
    assert torch.autograd.gradcheck(lambda a, b: lorentz.logmap(a, b, 1.3), (x, y))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_invalid_curvature_raises(bad):
    with pytest.raises(ValueError, match="curv"):
        lorentz.expmap0(torch.zeros(2, 3), bad)


def test_invalid_shapes_and_arguments_raise():
    with pytest.raises(ValueError, match="x must have shape"):
        lorentz.distance(torch.zeros(3, 1), torch.zeros(3, 1), 1.0)
    with pytest.raises(ValueError, match="min_radius"):
        lorentz.half_aperture(torch.ones(2, 3), 1.0, min_radius=0.0)
    with pytest.raises(ValueError, match="d must be"):
        lorentz.origin(0, 1.0)
