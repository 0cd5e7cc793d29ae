"""Classification heads against independent float64 computations."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from orchestrator.models.curvature import LearnableCurvature
from orchestrator.models.heads import (
    CosineHead,
    DSimplexHead,
    LinearHead,
    LorentzMLR,
    PoincarePrototypeHead,
    dsimplex_finetune_targets,
    expand_linear_head,
    simplex_prototypes_in_ball,
)


def _lorentz_points(n: int, d: int, curv: float) -> torch.Tensor:
    torch.manual_seed(1)
    space = torch.randn(n, d, dtype=torch.float64)
    time = torch.sqrt(1.0 / curv + (space**2).sum(dim=1, keepdim=True))
    return torch.cat([time, space], dim=1)


def _minkowski(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x[..., 1:] * y[..., 1:]).sum(-1) - x[..., 0] * y[..., 0]


@pytest.mark.parametrize("curv", [1.0, 0.3, 2.5])
def test_lorentz_mlr_equals_signed_scaled_hyperplane_distance(curv):
    d, num_classes = 6, 5
    head = LorentzMLR(d, num_classes, curv=curv).double()
    with torch.no_grad():
        head.a.uniform_(-1.0, 1.0)  # offsets large enough to matter
    h = _lorentz_points(40, d, curv)
    logits = head(h)
    assert logits.shape == (40, num_classes)

    # reference: build w_c explicitly and use the textbook point-to-hyperplane distance
    sk = math.sqrt(curv)
    expected = torch.empty(40, num_classes, dtype=torch.float64)
    for c in range(num_classes):
        a, z = head.a[c].detach(), head.z[c].detach()
        w = torch.cat([(torch.sinh(sk * a) * z.norm()).reshape(1), torch.cosh(sk * a) * z])
        w_lorentz_norm = torch.sqrt(_minkowski(w, w))
        for i in range(40):
            alpha = _minkowski(w, h[i])
            distance = torch.asinh(sk * alpha.abs() / w_lorentz_norm) / sk
            expected[i, c] = torch.sign(alpha) * w_lorentz_norm * distance
    torch.testing.assert_close(logits, expected, rtol=1e-10, atol=1e-12)


def test_lorentz_mlr_through_origin_gives_zero_logits_at_origin():
    curv = 0.7
    head = LorentzMLR(8, 4, curv=curv)
    with torch.no_grad():
        head.a.zero_()
    origin = torch.zeros(3, 9)
    origin[:, 0] = 1.0 / math.sqrt(curv)
    torch.testing.assert_close(head(origin), torch.zeros(3, 4))


def test_lorentz_mlr_init_and_shape_check():
    head = LorentzMLR(16, 10)
    bound = 1.0 / 4.0
    assert head.a.abs().max() <= bound and head.z.abs().max() <= bound
    with pytest.raises(ValueError, match="embedding"):
        head(torch.zeros(2, 16))


@pytest.mark.parametrize("scale", [3.0, 10.0])
def test_lorentz_mlr_init_scale_scales_the_normals_and_the_logits_linearly(scale):
    """init_scale multiplies Bdeir's draw of z_c (same random draw, same offsets a_c), and the
    logits are linear in ||z_c||: the scaled head's logits are ``scale`` times the plain ones."""
    torch.manual_seed(7)
    plain = LorentzMLR(12, 5, curv=0.8).double()
    torch.manual_seed(7)
    scaled = LorentzMLR(12, 5, curv=0.8, init_scale=scale).double()
    torch.testing.assert_close(scaled.a, plain.a)
    torch.testing.assert_close(scaled.z, plain.z * scale)
    assert scaled.z.abs().max() <= scale / math.sqrt(12)
    h = _lorentz_points(30, 12, 0.8)
    torch.testing.assert_close(scaled(h), plain(h) * scale, rtol=1e-5, atol=1e-6)  # float32 init draws


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), True])
def test_lorentz_mlr_rejects_a_bad_init_scale(bad):
    with pytest.raises(ValueError, match="init_scale must be finite and > 0"):
        LorentzMLR(4, 3, init_scale=bad)


def test_lorentz_mlr_learned_scale_multiplies_the_logits_and_receives_its_gradient():
    """learn_scale: logits = exp(log t) × the plain head's logits (same draw); the gradient of a
    loss L on the logits w.r.t. log t is Σ ∂L/∂logit · logit (since ∂logit/∂log t = logit), computed
    here from the logits alone; the clamp caps t at 100 (no gradient beyond it)."""
    torch.manual_seed(3)
    plain = LorentzMLR(6, 4, curv=1.3).double()
    torch.manual_seed(3)
    learned = LorentzMLR(6, 4, curv=1.3, learn_scale=True).double()
    assert [n for n, _ in plain.named_parameters()] == ["a", "z"]
    assert learned.log_scale.item() == 0.0 and plain.logit_scale == 1.0
    h = _lorentz_points(7, 6, 1.3)
    torch.testing.assert_close(learned(h), plain(h))  # t = 1 at init
    with torch.no_grad():
        learned.log_scale.fill_(math.log(2.5))
    logits = learned(h)
    torch.testing.assert_close(logits, 2.5 * plain(h))
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    torch.nn.functional.cross_entropy(logits, labels).backward()
    probs = torch.softmax(logits.detach(), dim=1)
    onehot = torch.nn.functional.one_hot(labels, 4).double()
    expected = ((probs - onehot) * logits.detach()).sum() / len(labels)
    torch.testing.assert_close(learned.log_scale.grad, expected)
    assert abs(learned.log_scale.grad.item()) > 1e-3
    with torch.no_grad():
        learned.log_scale.fill_(7.0)  # beyond ln 100
    learned.log_scale.grad = None
    capped = learned(h)
    torch.testing.assert_close(capped, 100.0 * plain(h))
    capped.sum().backward()
    assert learned.log_scale.grad.item() == 0.0


def test_lorentz_mlr_max_scale_caps_the_learned_scale():
    torch.manual_seed(3)
    plain = LorentzMLR(6, 4).double()
    torch.manual_seed(3)
    capped = LorentzMLR(6, 4, learn_scale=True, max_scale=3.0).double()
    h = _lorentz_points(5, 6, 1.0)
    with torch.no_grad():
        capped.log_scale.fill_(math.log(2.0))  # below the cap: t = 2
    torch.testing.assert_close(capped(h), 2.0 * plain(h))
    with torch.no_grad():
        capped.log_scale.fill_(math.log(5.0))  # above it: t = 3
    torch.testing.assert_close(capped(h), 3.0 * plain(h))
    for bad in (0.5, float("inf"), True):
        with pytest.raises(ValueError, match="max_scale must be finite and >= 1"):
            LorentzMLR(6, 4, learn_scale=True, max_scale=bad)


def test_lorentz_mlr_shares_learnable_curvature():
    curvature = LearnableCurvature(1.5)
    head = LorentzMLR(4, 3, curv=curvature)
    head(_lorentz_points(5, 4, 1.5).float()).sum().backward()
    assert curvature.log_curv.grad is not None and torch.isfinite(curvature.log_curv.grad)


@pytest.mark.parametrize("num_classes", [4, 10])
def test_dsimplex_head_is_fixed_and_gives_simplex_cosines(num_classes):
    head = DSimplexHead(num_classes)
    assert head.num_classes == num_classes and head.in_dim == num_classes - 1
    assert not any(p.requires_grad for p in head.parameters())
    assert len(list(head.parameters())) == 0
    w = head.weight.double()
    cos = w @ w.T / (w.norm(dim=1, keepdim=True) * w.norm(dim=1))
    off_diagonal = cos[~torch.eye(num_classes, dtype=torch.bool)]
    torch.testing.assert_close(off_diagonal, torch.full_like(off_diagonal, -1.0 / (num_classes - 1)), atol=1e-6, rtol=0)
    # logits are plain dot products with unit rows: ||z|| * cos(z, w_c), no bias, no scale
    torch.manual_seed(0)
    z = torch.randn(7, num_classes - 1)
    expected = z.norm(dim=1, keepdim=True) * torch.nn.functional.cosine_similarity(z[:, None], head.weight[None], dim=-1)
    torch.testing.assert_close(head(z), expected, atol=1e-5, rtol=1e-5)
    # feeding a prototype gives its own class the top logit
    assert torch.equal(head(head.weight).argmax(dim=1), torch.arange(num_classes))


def test_dsimplex_head_rejects_wrong_dims():
    with pytest.raises(ValueError, match="in_dim"):
        DSimplexHead(10, in_dim=128)
    with pytest.raises(ValueError, match="embedding"):
        DSimplexHead(10)(torch.zeros(2, 10))


def test_dsimplex_finetune_targets_right_to_left():
    labels = torch.tensor([0, 1, 99])
    assert dsimplex_finetune_targets(labels, 1024).tolist() == [1023, 1022, 924]
    with pytest.raises(ValueError, match="labels"):
        dsimplex_finetune_targets(torch.tensor([1024]), 1024)


def test_simplex_prototypes_in_ball_are_equidistant_and_on_radius():
    protos = simplex_prototypes_in_ball(5, dim=8, radius=0.9)
    assert protos.shape == (5, 8)
    assert torch.all(protos[:, 4:] == 0)
    torch.testing.assert_close(protos.norm(dim=1), torch.full((5,), 0.9))
    head = PoincarePrototypeHead(protos, curv=1.0)
    pairwise = -head(protos)
    off = [float(pairwise[i, j]) for i, j in itertools.combinations(range(5), 2)]
    assert max(off) - min(off) < 1e-4
    # closed form d = arcosh(1 + 2||x-y||^2 / ((1-||x||^2)(1-||y||^2))), c = 1
    chord = float((protos[0] - protos[1]).norm()) ** 2
    assert off[0] == pytest.approx(math.acosh(1 + 2 * chord / (1 - 0.81) ** 2), rel=1e-4)
    with pytest.raises(ValueError, match="dim"):
        simplex_prototypes_in_ball(5, dim=3, radius=0.5)


def test_poincare_prototype_head_argmax_is_nearest_prototype():
    curv = 0.1
    protos = simplex_prototypes_in_ball(6, dim=7, radius=1.0)
    head = PoincarePrototypeHead(protos, curv=curv)
    assert head.num_classes == 6 and not list(head.parameters())
    torch.manual_seed(0)
    e = torch.randn(200, 7, dtype=torch.float64)
    e = e / e.norm(dim=1, keepdim=True) * torch.rand(200, 1, dtype=torch.float64) * 3.0  # inside radius 3.16
    logits = head.double()(e)
    # brute-force geodesic distances (closed arcosh form, binary_hyperbolic §2.1)
    p = head.prototypes
    chord = ((e[:, None] - p[None]) ** 2).sum(-1)
    denom = (1 - curv * (e**2).sum(-1))[:, None] * (1 - curv * (p**2).sum(-1))[None]
    distance = torch.acosh(1 + 2 * curv * chord / denom) / math.sqrt(curv)
    torch.testing.assert_close(logits, -distance, rtol=1e-8, atol=1e-8)
    assert torch.equal(logits.argmax(dim=1), distance.argmin(dim=1))


def test_poincare_prototype_head_rejects_prototypes_outside_ball():
    with pytest.raises(ValueError, match="ball"):
        PoincarePrototypeHead(simplex_prototypes_in_ball(3, 2, radius=1.0), curv=1.0)


def test_cosine_head_is_scaled_cosine():
    head = CosineHead(5, 3, scale=16.0)
    torch.manual_seed(0)
    x = torch.randn(4, 5)
    expected = 16.0 * torch.nn.functional.cosine_similarity(x[:, None], head.weight[None], dim=-1)
    torch.testing.assert_close(head(x), expected)


def test_expand_linear_head_keeps_old_rows():
    head = LinearHead(4, 3)
    rows = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    bigger = expand_linear_head(head, 5, init_rows=rows)
    assert bigger.num_classes == 5 and isinstance(bigger, LinearHead)
    torch.testing.assert_close(bigger.weight[:3], head.weight)
    torch.testing.assert_close(bigger.bias[:3], head.bias)
    torch.testing.assert_close(bigger.weight[3:], rows)
    assert torch.equal(bigger.bias[3:], torch.zeros(2))
    x = torch.randn(6, 4)
    torch.testing.assert_close(bigger(x)[:, :3], head(x))
    assert bigger.weight.data_ptr() != head.weight.data_ptr()
    with pytest.raises(ValueError, match="new_num_classes"):
        expand_linear_head(head, 2)
    with pytest.raises(ValueError, match="init_rows"):
        expand_linear_head(head, 5, init_rows=torch.zeros(3, 4))
