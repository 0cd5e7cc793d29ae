"""LCE (methods/lce.py) and the ArcFace logits it shares with UniBCT (methods/common.py), each
checked against an independent float64 computation written with explicit loops."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from image_data import LabelShiftedImages
from orchestrator.methods.base import TrainContext, embed_dataset
from orchestrator.methods.common import arcface_logits, iqr_class_radii
from orchestrator.methods.independent import Independent
from orchestrator.methods.lce import LCE, angular_boundary_loss, old_class_geometry
from orchestrator.models.encoder import EncoderConfig

NUM_CLASSES = 5  # class 4 has no training image (labels i % 4)
OLD_CLASSES = [0, 1]


# --- ArcFace ----------------------------------------------------------------------------------
def _arcface_reference(emb, weights, labels, s, m):
    """s·cos(θ + m) at the target (the angle capped at π), s·cos θ elsewhere, by hand."""
    rows = []
    for e, y in zip(emb, labels):
        row = []
        for j, w in enumerate(weights):
            cos = float(np.dot(e, w) / (np.linalg.norm(e) * np.linalg.norm(w)))
            if j == y:
                theta = math.acos(max(-1.0, min(1.0, cos)))
                row.append(s * math.cos(min(theta + m, math.pi)))
            else:
                row.append(s * cos)
        rows.append(row)
    return np.array(rows)


def test_arcface_logits_equal_a_hand_computation():
    generator = torch.Generator().manual_seed(0)
    emb = torch.randn(6, 3, generator=generator, dtype=torch.float64) * 2.0
    weights = torch.randn(4, 3, generator=generator, dtype=torch.float64) * 0.5
    labels = torch.tensor([0, 1, 2, 3, 1, 0])
    logits = arcface_logits(emb, weights, labels, scale=30.0, margin=0.3)
    expected = _arcface_reference(emb.numpy(), weights.numpy(), labels.tolist(), 30.0, 0.3)
    np.testing.assert_allclose(logits.numpy(), expected, rtol=1e-10, atol=1e-10)
    # the margin lowers exactly the target logit
    plain = arcface_logits(emb, weights, labels, scale=30.0, margin=0.0)
    lowered = logits < plain
    assert lowered.sum() == len(labels) and lowered[torch.arange(6), labels].all()


def test_arcface_margin_zero_is_the_scaled_cosine_softmax():
    generator = torch.Generator().manual_seed(1)
    emb = torch.randn(5, 4, generator=generator)
    weights = torch.randn(3, 4, generator=generator)
    labels = torch.tensor([2, 0, 1, 1, 0])
    cosine = torch.nn.functional.normalize(emb, dim=1) @ torch.nn.functional.normalize(weights, dim=1).T
    torch.testing.assert_close(arcface_logits(emb, weights, labels, 16.0, 0.0), 16.0 * cosine)


def test_arcface_target_angle_is_capped_at_pi_and_absent_classes_are_excluded():
    weights = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    # θ to class 0 is 170°: θ + 0.5 rad passes π, so the target logit is −s (not cos(θ + m) > −1)
    angle = math.radians(170.0)
    emb = torch.tensor([[math.cos(angle), math.sin(angle)]], dtype=torch.float64)
    logits = arcface_logits(emb, weights, torch.tensor([0]), 10.0, 0.5, present=torch.tensor([True, True, False]))
    assert logits[0, 0].item() == pytest.approx(-10.0)
    assert logits[0, 1].item() == pytest.approx(10.0 * math.sin(angle))
    assert logits[0, 2].item() == float("-inf")
    # non-increasing in the angle across the cap
    angles = torch.linspace(0.0, math.pi, 200, dtype=torch.float64)
    points = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1)
    target = arcface_logits(points, weights[:2], torch.zeros(200, dtype=torch.long), 1.0, 0.5)[:, 0]
    assert (target[1:] <= target[:-1] + 1e-12).all()


def test_arcface_gradient_is_finite_at_perfect_alignment():
    emb = torch.tensor([[2.0, 0.0]], requires_grad=True)
    logits = arcface_logits(emb, torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0]), 30.0, 0.3)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0])).backward()
    assert torch.isfinite(emb.grad).all()


# --- radii and the boundary -------------------------------------------------------------------
def _fenced_max(values, factor=1.5):
    values = sorted(values)
    n = len(values)
    if n >= 4:
        q1, q3 = values[n // 4], values[(3 * n) // 4]
        values = [v for v in values if q1 - factor * (q3 - q1) <= v <= q3 + factor * (q3 - q1)]
    return max(values), len(values)


def test_iqr_class_radii_drop_outliers_like_the_benchmark():
    distances = torch.tensor([0.1, 0.2, 0.3, 0.25, 5.0, 0.4, 0.7, 0.15, 0.9])
    labels = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 2])
    radii, inliers = iqr_class_radii(distances, labels, 4)
    # class 0: q1 = 0.15, q3 = 0.3 → fence [−0.075, 0.525]: 5.0 is dropped; classes 1, 2: < 4 items
    assert radii.tolist() == pytest.approx([0.3, 0.7, 0.9, 0.0])
    assert inliers.tolist() == [4, 3, 1, 0]
    for c in range(3):
        expected = _fenced_max([d for d, y in zip(distances.tolist(), labels.tolist()) if y == c])
        assert radii[c].item() == pytest.approx(expected[0]) and inliers[c].item() == expected[1]


def test_angular_boundary_is_zero_inside_and_the_excess_angle_outside():
    centres = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    radii = torch.tensor([0.5, 0.2, 0.1])
    bounded = torch.tensor([True, True, False])
    inside = torch.tensor([[math.cos(0.3), math.sin(0.3)], [math.sin(0.1), math.cos(0.1)]]) * 3.0
    assert angular_boundary_loss(inside, torch.tensor([0, 1]), centres, radii, bounded).item() == 0.0
    # item 0 is 0.8 rad from its centre (0.3 too far), item 1 inside, item 2 far but unbounded
    points = torch.tensor([[math.cos(0.8), math.sin(0.8)], [math.sin(0.1), math.cos(0.1)], [1.0, 0.0]])
    loss = angular_boundary_loss(points, torch.tensor([0, 1, 2]), centres, radii, bounded)
    assert loss.item() == pytest.approx((0.3 + 0.0) / 2, rel=1e-5)  # mean over the two bounded items
    assert angular_boundary_loss(points[2:], torch.tensor([2]), centres, radii, bounded).item() == 0.0


# --- the method -------------------------------------------------------------------------------
def _encoder() -> EncoderConfig:
    return EncoderConfig(arch="test_resnet", embed_dim=6, small_input=False)


def _setup(params=None):
    data = LabelShiftedImages(n=40, num_classes=4, seed=3)
    torch.manual_seed(1)
    parent = Independent().build_model(_encoder(), NUM_CLASSES, seen_classes=OLD_CLASSES).eval()
    method = LCE(params)
    torch.manual_seed(2)
    model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
    ctx = TrainContext(new_model=model, old_model=parent, train_data=data, num_classes=NUM_CLASSES, batch_size=16)
    method.on_train_start(ctx)
    return data, parent, model, method, ctx


def _expected_geometry(parent, data):
    out, labels = embed_dataset(parent, data, batch_size=7)
    emb, labels = out.embedding.double().numpy(), labels.numpy()
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    centres = np.zeros((NUM_CLASSES, emb.shape[1]))
    radii, inliers = np.zeros(NUM_CLASSES), np.zeros(NUM_CLASSES, dtype=int)
    for c in range(NUM_CLASSES):
        members = unit[labels == c]
        if len(members) == 0:
            continue
        mean = members.mean(axis=0)
        centres[c] = mean / np.linalg.norm(mean)
        angles = [math.acos(max(-1.0, min(1.0, float(m @ centres[c])))) for m in members]
        radii[c], inliers[c] = _fenced_max(angles)
    return centres, radii, inliers


def test_lce_old_geometry_from_the_parent_over_the_training_set():
    data, parent, _model, _method, ctx = _setup()
    centres, radii, inliers = _expected_geometry(parent, data)
    np.testing.assert_allclose(ctx.state["lce/centres"].double().numpy(), centres, atol=1e-5)
    np.testing.assert_allclose(ctx.state["lce/radii"].double().numpy(), radii, atol=1e-3)
    assert ctx.state["lce/present"].tolist() == [True, True, True, True, False]
    # boundaries only for the classes the parent was trained on (and that have ≥ 2 inliers)
    assert ctx.state["lce/bounded"].tolist() == [True, True, False, False, False]
    geometry = old_class_geometry(embed_dataset(parent, data)[0].embedding, torch.as_tensor(data.labels), NUM_CLASSES)
    assert geometry[3].tolist() == inliers.tolist()


def test_lce_terms_equal_the_hand_computation():
    params = {"lam": 0.6, "boundary_weight": 2.0, "scale": 20.0, "margin": 0.4}
    data, parent, model, method, ctx = _setup(params)
    centres, radii, _ = _expected_geometry(parent, data)
    images = torch.stack([data[i][0] for i in range(12)])
    labels = torch.stack([data[i][1] for i in range(12)])
    new = model(images)
    with torch.no_grad():
        old = parent(images)
    terms = method.loss(new, old, labels, ctx)
    assert set(terms) == {"base", "arcface", "boundary"}

    emb = new.embedding.detach().double().numpy()
    logits = _arcface_reference(emb, centres[:4], labels.tolist(), 20.0, 0.4)  # class 4 is absent
    ce = np.mean([np.log(np.exp(row - row.max()).sum()) + row.max() - row[y] for row, y in zip(logits, labels.tolist())])
    assert terms["arcface"].item() == pytest.approx(0.6 * ce, rel=1e-4)
    excess = []
    for e, y in zip(emb, labels.tolist()):
        if y in OLD_CLASSES:
            angle = math.acos(float(e @ centres[y]) / np.linalg.norm(e))
            excess.append(max(0.0, angle - radii[y]))
    assert terms["boundary"].item() == pytest.approx(2.0 * sum(excess) / len(excess), rel=1e-3, abs=1e-5)
    assert terms["base"].item() == pytest.approx(torch.nn.functional.cross_entropy(new.logits, labels).item())

    # the terms reach the new encoder; the old centres are constants
    (terms["arcface"] + terms["boundary"]).backward()
    assert model.encoder.projection.weight.grad.abs().sum() > 0
    assert not ctx.state["lce/centres"].requires_grad


def test_lce_needs_a_parent():
    method = LCE()
    model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
    ctx = TrainContext(new_model=model, old_model=None, train_data=LabelShiftedImages(n=8), num_classes=NUM_CLASSES)
    with pytest.raises(ValueError, match="lce needs a parent"):
        method.on_train_start(ctx)
