"""Space lifts: right space, clip, sqrt(d) rescale, learnable curvature."""
from __future__ import annotations

import math

import pytest
import torch

from orchestrator.geometry.spaces import Space
from orchestrator.models.curvature import LearnableCurvature
from orchestrator.models.lifts import CosineLift, EuclideanLift, LorentzLift, PoincareLift, build_lift, clip_norm


def _batch(scale: float = 5.0, d: int = 16, n: int = 64) -> torch.Tensor:
    torch.manual_seed(0)
    z = torch.randn(n, d, dtype=torch.float64) * scale
    z[0] = 0.0  # the origin must go through every lift without NaN
    return z


def test_euclidean_lift_is_identity():
    z = _batch()
    features, embedding = EuclideanLift()(z)
    assert torch.equal(features, z) and torch.equal(embedding, z)
    assert EuclideanLift().space is Space.EUCLIDEAN


def test_cosine_lift_normalises_embedding_keeps_raw_features():
    z = _batch()[1:]
    features, embedding = CosineLift()(z)
    assert torch.equal(features, z)
    torch.testing.assert_close(embedding.norm(dim=1), torch.ones(len(z), dtype=z.dtype))
    torch.testing.assert_close(embedding * z.norm(dim=1, keepdim=True), z)


@pytest.mark.parametrize("curv", [1.0, 0.5, 2.0])
def test_lorentz_lift_lands_on_hyperboloid_and_respects_clip(curv):
    z = _batch(d=16)
    lift = LorentzLift(curv=curv, clip=1.2)
    features, embedding = lift(z)
    assert lift.space is Space.LORENTZ and embedding.shape == (64, 17)
    assert torch.all(features.norm(dim=1) <= 1.2 + 1e-12)
    minkowski = (embedding[:, 1:] ** 2).sum(dim=1) - embedding[:, 0] ** 2
    torch.testing.assert_close(minkowski, torch.full((64,), -1.0 / curv, dtype=z.dtype), rtol=1e-10, atol=1e-10)
    assert torch.all(embedding[:, 0] > 0)
    # independent closed form of expmap0 at the origin (HBCT §2)
    sk = math.sqrt(curv)
    norm = features.norm(dim=1, keepdim=True)
    expected_space = torch.where(norm > 0, torch.sinh(sk * norm) / (sk * norm).clamp_min(1e-300) * features, 0.0)
    torch.testing.assert_close(embedding[:, 1:], expected_space, rtol=1e-10, atol=1e-12)


def test_lorentz_lift_rescales_by_sqrt_d_before_clip():
    z = _batch(scale=0.01, d=64)  # small enough that the clip does not act after /sqrt(64)
    features, _ = LorentzLift(clip=1.0, rescale=True)(z)
    torch.testing.assert_close(features, z / 8.0)
    features_no_rescale, _ = LorentzLift(clip=None, rescale=False)(z)
    torch.testing.assert_close(features_no_rescale, z)


def test_clip_norm_matches_min_formula():
    z = _batch()
    clipped = clip_norm(z, 2.0)
    norms = z.norm(dim=1, keepdim=True)
    expected = z * torch.minimum(torch.ones_like(norms), 2.0 / norms.clamp_min(1e-300))
    torch.testing.assert_close(clipped, expected)
    assert torch.equal(clip_norm(z, None), z)


def test_clip_has_finite_gradient_at_zero():
    z = torch.zeros(3, 8, requires_grad=True)
    _, embedding = LorentzLift(clip=1.0)(z)
    embedding.sum().backward()
    assert torch.isfinite(z.grad).all()


@pytest.mark.parametrize("curv", [0.1, 1.0])
def test_poincare_lift_lands_in_ball(curv):
    z = _batch(scale=50.0)
    lift = PoincareLift(curv=curv)
    features, embedding = lift(z)
    assert lift.space is Space.POINCARE and embedding.shape == z.shape
    assert torch.equal(features, z)
    assert torch.all(embedding.norm(dim=1) ** 2 <= (1 - 1e-3) / curv + 1e-12)
    # inside the margin, e = tanh(sqrt(c)||z||) z / (sqrt(c)||z||)
    small = z[1:] * 1e-3
    _, e_small = lift(small)
    sk = math.sqrt(curv)
    n = small.norm(dim=1, keepdim=True)
    torch.testing.assert_close(e_small, torch.tanh(sk * n) * small / (sk * n))


def test_poincare_lift_clip():
    z = _batch()
    features, _ = PoincareLift(curv=0.1, clip=0.5)(z)
    assert torch.all(features.norm(dim=1) <= 0.5 + 1e-12)


def test_learnable_curvature_gets_gradients_and_is_clamped():
    lift = LorentzLift(curv=1.0, learn_curv=True)
    assert isinstance(lift.curvature, LearnableCurvature)
    z = torch.randn(8, 4)
    _, embedding = lift(z)
    embedding[:, 0].sum().backward()
    grad = lift.curvature.log_curv.grad
    assert grad is not None and torch.isfinite(grad) and grad != 0
    with torch.no_grad():
        lift.curvature.log_curv.fill_(math.log(100.0))
    assert float(lift.curv.detach()) == pytest.approx(10.0)
    with torch.no_grad():
        lift.curvature.log_curv.fill_(math.log(1e-4))
    assert float(lift.curv.detach()) == pytest.approx(0.1)


def test_build_lift_factory():
    assert isinstance(build_lift("euclidean"), EuclideanLift)
    assert isinstance(build_lift(Space.COSINE), CosineLift)
    lorentz = build_lift("lorentz", curv=0.5, clip=1.2)
    assert isinstance(lorentz, LorentzLift) and lorentz.curv == 0.5 and lorentz.clip == 1.2 and lorentz.rescale
    poincare = build_lift("poincare", curv=0.1)
    assert isinstance(poincare, PoincareLift) and poincare.curv == 0.1
    with pytest.raises(ValueError, match="space"):
        build_lift("spherical")
    with pytest.raises(ValueError, match="clip"):
        build_lift("euclidean", clip=1.0)
    with pytest.raises(ValueError, match="curv"):
        build_lift("lorentz", curv=-1.0)
    with pytest.raises(ValueError, match="clip"):
        LorentzLift(clip=0.0)
