"""NDPP / ODPP (prototype_perturbation.md): Eq. 6 against a float64 brute force, Eqs. 4 / 7 on a
hand-computed 2-D example, the ODPP inner optimisation, and both methods end to end on a tiny model."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from image_data import LabelShiftedImages
from orchestrator.methods.base import TrainContext, embed_dataset
from orchestrator.methods.ndpp import NDPP, NEW_REPULSION, OLD_REPULSION, PSEUDO_OLD
from orchestrator.methods.odpp import ODPP, PERTURBATIONS
from orchestrator.methods.prototypes import (
    OLD_PROTOTYPES,
    POSITIVES,
    PRESENT,
    neighbour_repulsion,
    odpp_perturbation_objective,
    optimise_odpp_perturbations,
    perturbed_prototype_contrastive_loss,
    sample_class_pairs,
)
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.config import TrainConfig
from orchestrator.training.loop import train_generation


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _reference_eq6(emb, labels, old, positive, tau, present=None) -> float:
    """Eq. 6 written out per sample in float64: explicit softmax, perturbed positive, real negatives."""
    emb, old, positive = (np.asarray(x, dtype=np.float64) for x in (emb, old, positive))
    losses = []
    for e, y in zip(emb, labels):
        pos = math.exp(_cos(e, positive[y]) / tau)
        negs = sum(math.exp(_cos(e, old[c]) / tau) for c in range(len(old))
                   if c != y and (present is None or present[c]))
        losses.append(-math.log(pos / (pos + negs)))
    return float(np.mean(losses))


# --- Eq. 6 ------------------------------------------------------------------------------------
def test_eq6_matches_float64_softmax_with_perturbed_positive_and_real_negatives():
    g = torch.Generator().manual_seed(0)
    emb, old = torch.randn(7, 5, generator=g), torch.randn(6, 5, generator=g)
    positive = old + 0.3 * torch.randn(6, 5, generator=g)
    labels = torch.tensor([0, 1, 2, 3, 4, 5, 2])
    got = perturbed_prototype_contrastive_loss(emb, labels, old, positive, tau=0.5)
    assert got.item() == pytest.approx(_reference_eq6(emb, labels.tolist(), old, positive, 0.5), rel=1e-5)


def test_eq6_present_mask_drops_absent_negatives():
    g = torch.Generator().manual_seed(1)
    emb, old = torch.randn(5, 4, generator=g), torch.randn(6, 4, generator=g)
    positive = old + 0.2 * torch.randn(6, 4, generator=g)
    present = torch.tensor([True, True, False, True, True, False])
    labels = torch.tensor([0, 1, 3, 4, 0])
    got = perturbed_prototype_contrastive_loss(emb, labels, old, positive, 0.3, present=present)
    want = _reference_eq6(emb, labels.tolist(), old, positive, 0.3, present.tolist())
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_eq6_without_perturbation_is_the_plain_prototype_loss_eq2():
    g = torch.Generator().manual_seed(2)
    emb, old = torch.randn(8, 6, generator=g), torch.randn(4, 6, generator=g)
    labels = torch.tensor([0, 1, 2, 3, 3, 2, 1, 0])
    tau = 0.07
    e = emb.double() / emb.double().norm(dim=1, keepdim=True)
    p = old.double() / old.double().norm(dim=1, keepdim=True)
    log_prob = torch.log_softmax(e @ p.T / tau, dim=1)
    eq2 = -log_prob[torch.arange(8), labels].mean().item()
    got = perturbed_prototype_contrastive_loss(emb, labels, old, old.clone(), tau)
    assert got.item() == pytest.approx(eq2, rel=1e-5)


def test_eq6_rejects_bad_arguments():
    emb, old, labels = torch.randn(2, 3), torch.randn(4, 3), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="tau"):
        perturbed_prototype_contrastive_loss(emb, labels, old, old, tau=0.0)
    with pytest.raises(ValueError, match="dimension"):
        perturbed_prototype_contrastive_loss(torch.randn(2, 5), labels, old, old, tau=0.1)


# --- Eqs. 4 / 7 -------------------------------------------------------------------------------
def test_neighbour_repulsion_hand_computed_2d_points_away_from_neighbours():
    # anchor (1, 0); candidates with cosines 0.6, 0.8, -1 to it.
    anchors = torch.tensor([[1.0, 0.0]])
    candidates = torch.tensor([[0.6, 0.8], [0.8, -0.6], [-1.0, 0.0]])
    r = neighbour_repulsion(anchors, candidates, k=2, exclude_self=False)
    # (0.6 * ((1,0) - (0.6,0.8)) + 0.8 * ((1,0) - (0.8,-0.6))) / 1.4 = (0.4, 0) / 1.4
    assert torch.allclose(r, torch.tensor([[0.4 / 1.4, 0.0]]), atol=1e-6)
    centroid = (0.6 * candidates[0] + 0.8 * candidates[1]) / 1.4
    assert float(r[0] @ (centroid - anchors[0])) < 0  # away from the neighbours, not towards them
    # third neighbour has cosine -1: clamped weight 0, so k = 3 gives the same value.
    assert torch.allclose(neighbour_repulsion(anchors, candidates, k=3, exclude_self=False), r, atol=1e-6)


def test_neighbour_repulsion_exclude_self_and_k_clamped():
    points = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.8, -0.6], [-1.0, 0.0]])
    with_self = neighbour_repulsion(points, points, k=2, exclude_self=False)
    # the point itself (weight 1, zero difference) and (0.8, -0.6) (weight 0.8)
    assert torch.allclose(with_self[0], 0.8 * torch.tensor([0.2, 0.6]) / 1.8, atol=1e-6)
    without_self = neighbour_repulsion(points, points, k=2, exclude_self=True)
    assert torch.allclose(without_self[0], torch.tensor([0.4 / 1.4, 0.0]), atol=1e-6)
    # point 3 = (-1, 0): cosines -0.6, -0.8, -1 to the others -> all weights vanish -> zero repulsion
    assert torch.equal(without_self[3], torch.zeros(2))
    # k larger than the number of other classes is clamped: same as k = 3
    assert torch.allclose(neighbour_repulsion(points, points, k=100, exclude_self=True),
                          neighbour_repulsion(points, points, k=3, exclude_self=True), atol=1e-6)


def test_neighbour_repulsion_mask_and_chunking_match_brute_force():
    g = torch.Generator().manual_seed(3)
    anchors, candidates = torch.randn(9, 4, generator=g), torch.randn(9, 4, generator=g)
    mask = torch.ones(9, dtype=torch.bool)
    mask[[2, 5]] = False
    got = neighbour_repulsion(anchors, candidates, k=3, exclude_self=True, candidate_mask=mask, chunk_size=2)
    a, b = anchors.double().numpy(), candidates.double().numpy()
    for i in range(9):
        sims = sorted(((_cos(a[i], b[j]), j) for j in range(9) if j != i and mask[j]), reverse=True)[:3]
        weights = [(max(s, 0.0), j) for s, j in sims]
        total = sum(w for w, _ in weights)
        want = sum(w * (a[i] - b[j]) for w, j in weights) / total if total > 0 else np.zeros(4)
        np.testing.assert_allclose(got[i].numpy(), want, atol=1e-5)


# --- Eqs. 9 / 11 ------------------------------------------------------------------------------
def _all_pairs(present: torch.Tensor) -> torch.Tensor:
    classes = torch.nonzero(present).flatten().tolist()
    return torch.tensor([(c, d) for c in classes for d in classes if c != d])


def _clustered_prototypes(num: int, dim: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.ones(dim) + 0.6 * torch.randn(num, dim, generator=g), dim=1)


def test_odpp_objective_matches_explicit_double_sum():
    old, new = _clustered_prototypes(5, 4, 4), _clustered_prototypes(5, 4, 5)
    r = 0.05 * torch.randn(5, 4, generator=torch.Generator().manual_seed(6))
    pairs = torch.tensor([[0, 1], [1, 0], [2, 4], [3, 1]])
    got = odpp_perturbation_objective(old, r, pairs, 0.6, new, theta_new=0.5, gamma=0.7)
    p = (old + r).double()
    want = sum(max(0.0, float(p[c] @ p[d]) - 0.6) + 0.7 * max(0.0, float(p[c] @ new[d].double()) - 0.5)
               for c, d in pairs.tolist())
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_sample_class_pairs_distinct_present_and_deterministic():
    present = torch.tensor([True, False, True, True, False, True])
    pairs = sample_class_pairs(present, 500, torch.Generator().manual_seed(0))
    assert pairs.shape == (500, 2)
    assert bool((pairs[:, 0] != pairs[:, 1]).all())
    assert set(pairs.flatten().tolist()) == {0, 2, 3, 5}
    assert torch.equal(pairs, sample_class_pairs(present, 500, torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("with_new", [False, True])
def test_odpp_inner_optimisation_reduces_objective_and_hard_pairs(with_new):
    old = _clustered_prototypes(12, 6, 7)
    new = _clustered_prototypes(12, 6, 8) if with_new else None
    present = torch.ones(12, dtype=torch.bool)
    present[11] = False
    pairs = _all_pairs(present)
    zero = torch.zeros_like(old)

    def hard_pairs(r):
        p = old + r
        count = int(((p[pairs[:, 0]] * p[pairs[:, 1]]).sum(1) > 0.6).sum())
        if with_new:
            count += int(((p[pairs[:, 0]] * new[pairs[:, 1]]).sum(1) > 0.6).sum())
        return count

    r = optimise_odpp_perturbations(old, zero, present, torch.Generator().manual_seed(0), 0.6,
                                    new_prototypes=new, theta_new=0.6, gamma=1.0,
                                    inner_epochs=20, lr=1e-3, batch_size=64, pairs_per_epoch=256)
    before = odpp_perturbation_objective(old, zero, pairs, 0.6, new, 0.6, 1.0).item()
    after = odpp_perturbation_objective(old, r, pairs, 0.6, new, 0.6, 1.0).item()
    assert before > 1.0 and after < 0.5 * before
    assert hard_pairs(r) < hard_pairs(zero)
    assert torch.equal(r[11], torch.zeros(6))  # absent class never sampled
    again = optimise_odpp_perturbations(old, zero, present, torch.Generator().manual_seed(0), 0.6,
                                        new_prototypes=new, inner_epochs=20, batch_size=64, pairs_per_epoch=256)
    assert torch.equal(r, again)


# --- end to end -------------------------------------------------------------------------------
NUM_CLASSES = 5  # class 4 has no images: exercises the present mask
EMBED_DIM = 8


def _tiny_images(seed: int = 0) -> LabelShiftedImages:
    return LabelShiftedImages(n=24, num_classes=4, seed=seed, shift=1.0)


def _tiny_model(method, seed: int):
    torch.manual_seed(seed)
    config = EncoderConfig(arch="test_resnet", embed_dim=EMBED_DIM, small_input=True)
    return method.build_model(config, NUM_CLASSES, seen_classes=torch.arange(4))


def _prototypes_float64(model, data):
    out, labels = embed_dataset(model, data, batch_size=32)
    e = out.embedding.double()
    e = e / e.norm(dim=1, keepdim=True)
    protos = torch.zeros(NUM_CLASSES, EMBED_DIM, dtype=torch.float64)
    for c in range(4):
        mean = e[labels == c].mean(0)
        protos[c] = mean / mean.norm()
    return protos


def _run(method, epochs=2):
    data = _tiny_images()
    parent = _tiny_model(method, seed=1)
    model = _tiny_model(method, seed=2)
    snapshots = [copy.deepcopy(model)]  # the model at the start of each epoch, then the final one
    config = TrainConfig(epochs=epochs, batch_size=8, lr=0.05, augment=False)
    ctx_holder = {}
    original = method.on_train_start

    def capture(ctx: TrainContext):
        ctx_holder["ctx"] = ctx
        original(ctx)

    method.on_train_start = capture
    history = train_generation(method, model, data, data, config, old_model=parent,
                               on_epoch_end=lambda e, s: snapshots.append(copy.deepcopy(model)))
    return history, ctx_holder["ctx"], parent, snapshots, data


def test_ndpp_old_end_to_end_positive_is_p_o_plus_alpha_r_o():
    method = NDPP({"new_perturbation": False, "alpha_old": 0.05, "k": 2})
    history, ctx, parent, _, data = _run(method)
    for stats in history:
        assert all(math.isfinite(v) for v in stats.values())
        assert stats["loss/compatibility"] > 0 and stats["loss/base"] > 0
    p_o = _prototypes_float64(parent, data)
    assert torch.allclose(ctx.state[OLD_PROTOTYPES].double(), p_o, atol=1e-5)
    assert torch.equal(ctx.state[PRESENT], torch.tensor([True, True, True, True, False]))
    r_o = ctx.state[OLD_REPULSION]
    want_r = neighbour_repulsion(p_o, p_o, k=2, exclude_self=True, candidate_mask=ctx.state[PRESENT])
    assert torch.allclose(r_o.double(), want_r, atol=1e-5)
    delta = (ctx.state[POSITIVES] - ctx.state[OLD_PROTOTYPES]).norm(dim=1)
    assert torch.allclose(delta, 0.05 * r_o.norm(dim=1), atol=1e-6)
    assert float(delta[:4].min()) > 0 and float(delta[4]) == 0.0


@pytest.mark.parametrize("cumulative", [False, True])
def test_ndpp_end_to_end_eq8_with_new_neighbours(cumulative):
    method = NDPP({"k": 100, "cumulative": cumulative, "alpha_new": 0.1})
    history, ctx, _, snapshots, data = _run(method)
    assert all(math.isfinite(stats["loss/compatibility"]) for stats in history)
    # the last epoch's positives came from the model as it was at the end of the previous epoch
    p_n = _prototypes_float64(snapshots[-2], data)
    pseudo_old = ctx.state[PSEUDO_OLD].double()
    present = ctx.state[PRESENT]
    if cumulative:
        # Algorithm 1: epoch 0 already moved p̂ with the initial model's new prototypes
        first = neighbour_repulsion(pseudo_old, _prototypes_float64(snapshots[0], data), k=3,
                                    exclude_self=True, candidate_mask=present)
        anchor = pseudo_old + 0.1 * first
        assert float((anchor - pseudo_old).norm()) > 1e-4
    else:
        anchor = pseudo_old
    r_t = neighbour_repulsion(anchor, p_n, k=3, exclude_self=True, candidate_mask=present)
    assert torch.allclose(ctx.state[NEW_REPULSION].double(), r_t, atol=1e-5)
    assert torch.allclose(ctx.state[POSITIVES].double(), anchor + 0.1 * r_t, atol=1e-6)


def test_odpp_end_to_end_positive_is_p_o_plus_optimised_r():
    method = ODPP({"inner_epochs": 3, "inner_batch": 16, "max_pairs_per_epoch": 20, "theta_old": 0.0,
                   "theta_new": 0.0, "inner_lr": 0.01})
    history, ctx, _, snapshots, data = _run(method)
    assert all(math.isfinite(stats["loss/compatibility"]) for stats in history)
    p_o, r = ctx.state[OLD_PROTOTYPES], ctx.state[PERTURBATIONS]
    assert torch.equal(ctx.state[POSITIVES], p_o + r)
    assert float(r[:4].norm(dim=1).min()) > 0 and torch.equal(r[4], torch.zeros(EMBED_DIM))
    # the last inner run (Eq. 11 with the epoch-1 new prototypes) lowered its objective from its warm start
    p_n = _prototypes_float64(snapshots[-2], data).float()
    pairs = _all_pairs(ctx.state[PRESENT])
    final = odpp_perturbation_objective(p_o, r, pairs, 0.0, p_n, 0.0, 1.0).item()
    initial = odpp_perturbation_objective(p_o, torch.zeros_like(r), pairs, 0.0, p_n, 0.0, 1.0).item()
    assert final < initial


def test_odpp_old_keeps_eq9_perturbation_across_epochs():
    method = ODPP({"new_term": False, "inner_epochs": 2, "inner_batch": 8, "max_pairs_per_epoch": 16,
                   "theta_old": 0.0, "inner_lr": 0.01})
    _, ctx, _, _, _ = _run(method)
    p_o = ctx.state[OLD_PROTOTYPES]
    expected = optimise_odpp_perturbations(p_o, torch.zeros_like(p_o), ctx.state[PRESENT],
                                           torch.Generator().manual_seed(0), 0.0, inner_epochs=2, lr=0.01,
                                           batch_size=8, pairs_per_epoch=16)
    assert torch.equal(ctx.state[PERTURBATIONS], expected)
    assert torch.equal(ctx.state[POSITIVES], p_o + expected)


def test_methods_need_a_parent():
    for method in (NDPP(), ODPP()):
        assert method.requires_parent
        with pytest.raises(ValueError, match="parent"):
            train_generation(method, _tiny_model(method, 0), _tiny_images(), _tiny_images(),
                             TrainConfig(epochs=1, batch_size=8))


def test_ndpp_skip_first_epoch_new_uses_eq5_positives_at_epoch_0():
    method = NDPP({"skip_first_epoch_new": True, "k": 2})
    _, ctx, _, _, _ = _run(method, epochs=1)
    assert NEW_REPULSION not in ctx.state
    assert torch.equal(ctx.state[POSITIVES], ctx.state[PSEUDO_OLD])
    assert torch.allclose(ctx.state[PSEUDO_OLD], ctx.state[OLD_PROTOTYPES] + 0.01 * ctx.state[OLD_REPULSION])


def test_neighbour_repulsion_rejects_bad_arguments():
    points = torch.randn(3, 2)
    with pytest.raises(ValueError, match="k must"):
        neighbour_repulsion(points, points, k=0, exclude_self=True)
    with pytest.raises(ValueError, match="exclude_self"):
        neighbour_repulsion(points, torch.randn(4, 2), k=1, exclude_self=True)
