"""AdvBCT (methods/advbct.py): gradient reversal, the elastic boundary, the discriminator as a
training-only module (optimised, synchronised under DDP, kept out of deployed checkpoints)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from image_data import LabelShiftedImages
from orchestrator.methods.advbct import (
    AdvBCT,
    Discriminator,
    adversarial_loss,
    boundary_loss,
    elastic_radii,
    grad_reverse,
    grl_coefficient,
    old_class_boundaries,
)
from orchestrator.methods.base import TrainContext, embed_dataset
from orchestrator.methods.independent import Independent
from orchestrator.methods.loading import load_generation
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.config import TrainConfig
from orchestrator.training.loop import freeze, make_train_loader, train_generation, train_one_epoch
from orchestrator.training.optim import build_optimizer

NUM_CLASSES = 5  # class 4 has no training image (labels i % 4)


# --- gradient reversal ------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [1.0, 0.3, 0.0])
def test_gradient_reversal_is_the_identity_forward_and_flips_the_gradient(alpha):
    x = torch.randn(4, 3, requires_grad=True)
    weights = torch.randn(4, 3)
    y = grad_reverse(x, alpha)
    assert torch.equal(y, x)
    (y * weights).sum().backward()
    # the plain gradient of Σ w·x is w; through the reversal it is −α·w
    torch.testing.assert_close(x.grad, -alpha * weights)


def test_a_limited_reversal_scales_the_reversed_gradient_down_to_the_limit():
    x = torch.randn(4, 3, requires_grad=True)
    weights = torch.randn(4, 3)
    (grad_reverse(x, 0.5, limit=torch.tensor(0.1)) * weights).sum().backward()
    # −α·w has norm 0.5‖w‖ > 0.1: the direction is kept, the norm is the limit
    torch.testing.assert_close(x.grad, -weights / weights.norm() * 0.1)
    x.grad = None
    (grad_reverse(x, 0.5, limit=torch.tensor(1e6)) * weights).sum().backward()
    torch.testing.assert_close(x.grad, -0.5 * weights)  # within the limit: untouched


def test_grl_coefficient_ramps_from_zero_to_one():
    assert grl_coefficient(0.0) == 0.0
    assert grl_coefficient(0.5) == pytest.approx(2.0 / (1.0 + math.exp(-5.0)) - 1.0)
    assert grl_coefficient(1.0) == pytest.approx(1.0, abs=1e-4)
    values = [grl_coefficient(p / 10) for p in range(11)]
    assert values == sorted(values)
    assert grl_coefficient(0.7, gamma=0.0) == 0.0


def test_the_released_schedule_is_evaluated_at_the_epoch_midpoint_and_decays():
    method = AdvBCT({"grl_gamma": 8.0})
    alpha, decay = method.schedule(0, 4)
    assert alpha == pytest.approx(2.0 / (1.0 + math.exp(-8.0 * 0.125)) - 1.0)
    assert decay == pytest.approx(5 / 4)
    assert method.schedule(3, 4)[1] == pytest.approx(2 / 4)


def test_a_warmup_holds_the_reversal_off_then_ramps_over_the_remaining_epochs():
    released = AdvBCT({"adversarial_warmup": 0.0, "grl_gamma": 8.0})
    warm = AdvBCT({"adversarial_warmup": 0.25, "grl_gamma": 8.0})
    assert AdvBCT().params.adversarial_warmup == 0.0  # the released schedule is the default
    assert warm.schedule(0, 4) == (0.0, pytest.approx(5 / 4))  # W = 1 epoch: epoch 0 has no reversal
    # epoch 1: p = (1.5 − 1)/(4 − 1), the decay is the released one
    assert warm.schedule(1, 4)[0] == pytest.approx(grl_coefficient(0.5 / 3, 8.0))
    assert warm.schedule(3, 4)[0] == pytest.approx(grl_coefficient(2.5 / 3, 8.0))
    assert [warm.schedule(e, 4)[1] for e in range(4)] == [released.schedule(e, 4)[1] for e in range(4)]
    assert released.schedule(0, 4)[0] == pytest.approx(grl_coefficient(0.125, 8.0))
    assert [AdvBCT({"adversarial_warmup": 0.5}).schedule(e, 12)[0] for e in range(6)] == [0.0] * 6


# --- the elastic boundary ---------------------------------------------------------------------
def test_elastic_radii_interpolate_between_the_old_radius_and_the_threshold():
    max_radii = torch.tensor([0.3, 1.4, 0.5])
    weight = torch.tensor([0.0, 2.0, -1.0])
    radii = elastic_radii(max_radii, 1.0, weight)
    sigmoid = [0.5, 1 / (1 + math.exp(-2.0)), 1 / (1 + math.exp(1.0))]
    # the code's branches: r < T → r + σ|r − T|, r ≥ T → r − σ|r − T|
    expected = [0.3 + sigmoid[0] * 0.7, 1.4 - sigmoid[1] * 0.4, 0.5 + sigmoid[2] * 0.5]
    assert radii.tolist() == pytest.approx(expected)


def test_boundary_is_zero_inside_the_old_boundary_and_positive_outside():
    centres = torch.tensor([[0.9, 0.0], [0.0, 0.8], [0.0, -1.0]])
    radii = torch.tensor([0.3, 0.5, 0.1], requires_grad=True)
    bounded = torch.tensor([True, True, False])
    inside = torch.tensor([[1.0, 0.1], [0.2, 1.0]]) * 4.0  # unit: 0.1 and ~0.25 from their centres
    zero = boundary_loss(inside, torch.tensor([0, 1]), centres, radii, bounded)
    assert zero.item() == 0.0
    zero.backward()  # connected (DDP needs every parameter in the graph), zero gradient
    assert torch.equal(radii.grad, torch.zeros(3))

    radii.grad = None
    points = torch.tensor([[0.0, 1.0], [1.0, 0.05], [1.0, 0.0], [-1.0, 0.0]])
    labels = torch.tensor([0, 0, 1, 2])
    loss = boundary_loss(points, labels, centres, radii, bounded)
    unit = F.normalize(points, dim=1)
    d0 = math.dist(unit[0].tolist(), [0.9, 0.0])  # ~1.35 > 0.3
    d2 = math.dist(unit[2].tolist(), [0.0, 0.8])  # ~1.28 > 0.5
    # item 1 is inside (0.11 < 0.3), item 3 has no boundary: the mean over the two violators
    assert loss.item() == pytest.approx(((d0 - 0.3) + (d2 - 0.5)) / 2, rel=1e-5)
    assert loss.item() > 0
    loss.backward()
    # larger radii would lower the loss: the elastic weights learn through this gradient
    assert radii.grad[0] < 0 and radii.grad[1] < 0 and radii.grad[2] == 0


def test_old_class_boundaries_equal_a_numpy_computation():
    generator = torch.Generator().manual_seed(0)
    old = torch.randn(30, 4, generator=generator, dtype=torch.float64)
    labels = torch.arange(30) % 3
    old[0] = torch.tensor([9.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    centres, present, max_radii, inliers = old_class_boundaries(old, labels, 4)
    unit = old.numpy() / np.linalg.norm(old.numpy(), axis=1, keepdims=True)
    for c in range(3):
        members = unit[labels.numpy() == c]
        centre = members.mean(axis=0)  # not re-normalised
        np.testing.assert_allclose(centres[c].numpy(), centre, rtol=1e-12)
        distances = sorted(np.linalg.norm(members - centre, axis=1))
        n = len(distances)
        q1, q3 = distances[n // 4], distances[(3 * n) // 4]
        kept = [d for d in distances if q1 - 1.5 * (q3 - q1) <= d <= q3 + 1.5 * (q3 - q1)]
        assert max_radii[c].item() == pytest.approx(max(kept)) and inliers[c].item() == len(kept)
    assert present.tolist() == [True, True, True, False] and max_radii[3] == 0


# --- the discriminator ------------------------------------------------------------------------
def test_adversarial_gradient_trains_the_discriminator_and_reverses_into_the_encoder():
    torch.manual_seed(0)
    discriminator = Discriminator(3, hidden=8)
    new = torch.randn(6, 3, requires_grad=True)
    old = torch.randn(6, 3) + 1.0
    loss = adversarial_loss(discriminator, new, old, alpha=0.5)
    # the value: CE of D's logits, new rows → class 0, old rows → class 1 (one call per half)
    expected = F.cross_entropy(discriminator(new), torch.zeros(6, dtype=torch.long)) + \
        F.cross_entropy(discriminator(old), torch.ones(6, dtype=torch.long))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    d_grads = torch.autograd.grad(loss, [new, *discriminator.parameters()])
    plain_grads = torch.autograd.grad(expected, [new, *discriminator.parameters()])
    torch.testing.assert_close(d_grads[0], -0.5 * plain_grads[0])  # reversed into the encoder side
    for got, want in zip(d_grads[1:], plain_grads[1:]):  # D itself descends its own loss
        torch.testing.assert_close(got, want)


def _train_discriminator(make_batch, seed: int, steps: int = 300) -> list[float]:
    torch.manual_seed(seed)
    discriminator = Discriminator(3, hidden=16)
    optimiser = torch.optim.SGD(discriminator.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(seed + 1)
    losses = []
    for _ in range(steps):
        new, old = make_batch(generator)
        loss = adversarial_loss(discriminator, new, old, alpha=1.0)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


def test_the_discriminator_learns_a_difference_in_shape_between_the_models():
    """New embeddings bimodal along one axis, old ones Gaussian with the same spread: D's loss
    falls well below chance (2·ln 2, D guessing)."""

    def bimodal_vs_gaussian(generator):
        sign = torch.randint(0, 2, (64, 1), generator=generator) * 2.0 - 1.0
        new = torch.cat([2.0 * sign + 0.1 * torch.randn(64, 1, generator=generator),
                         torch.randn(64, 2, generator=generator)], dim=1)
        return new, torch.randn(64, 3, generator=generator) * torch.tensor([2.0, 1.0, 1.0])

    losses = _train_discriminator(bimodal_vs_gaussian, seed=2)
    assert np.mean(losses[:5]) > 1.38
    assert np.mean(losses[-20:]) < 1.0


def test_the_discriminator_does_not_see_a_pure_shift_as_released():
    """D runs once per model's half (the released code), so its BatchNorm standardises each half by
    its own statistics: two Gaussians that differ only by a shift stay indistinguishable."""

    def shifted(generator):
        offset = torch.tensor([2.0, 0.0, 0.0])
        return torch.randn(64, 3, generator=generator) + offset, torch.randn(64, 3, generator=generator) - offset

    losses = _train_discriminator(shifted, seed=2)
    assert abs(np.mean(losses[-20:]) - 2 * math.log(2)) < 0.02


def _encoder() -> EncoderConfig:
    return EncoderConfig(arch="test_resnet", embed_dim=6, small_input=False)


def _parent(num_classes: int = NUM_CLASSES, seen=(0, 1)):
    torch.manual_seed(1)
    return freeze(Independent().build_model(_encoder(), num_classes, seen_classes=list(seen)))


def test_the_discriminator_and_elastic_weights_are_trained_by_the_loop_optimiser():
    data = LabelShiftedImages(n=32, num_classes=4, seed=3)
    method = AdvBCT({"threshold": 0.05})  # a tight boundary: items violate it, w gets gradients
    torch.manual_seed(2)
    model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
    assert set(model.auxiliary) == {"discriminator", "elastic_boundary"}
    # built after the encoder and head: those start exactly as without the auxiliary modules
    torch.manual_seed(2)
    plain = Independent().build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
    for (name, a), (_, b) in zip(plain.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), name
    initial = {k: v.detach().clone() for k, v in model.auxiliary.named_parameters()}
    optimizer = build_optimizer(model, TrainConfig(lr=0.05, weight_decay=0.0))
    assert {id(p) for p in model.auxiliary.parameters()} <= {id(p) for g in optimizer.param_groups for p in g["params"]}

    config = TrainConfig(epochs=1, batch_size=16, lr=0.05, weight_decay=0.0, augment=False)
    history = train_generation(method, model, data, data, config, old_model=_parent())
    assert {"loss/base", "loss/boundary", "loss/adversarial"} <= set(history[0])
    assert history[0]["loss/boundary"] > 0 and history[0]["loss/adversarial"] > 0
    for name, value in model.auxiliary.named_parameters():
        assert not torch.equal(value.detach(), initial[name]), f"{name} did not train"


def test_on_train_start_needs_the_epochs_and_the_auxiliary_modules():
    data = LabelShiftedImages(n=16, num_classes=4)
    method = AdvBCT()
    model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
    ctx = TrainContext(new_model=model, old_model=_parent(), train_data=data, num_classes=NUM_CLASSES)
    with pytest.raises(ValueError, match="TrainContext.epochs"):
        method.on_train_start(ctx)
    bare = Independent().build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
    ctx = TrainContext(new_model=bare, old_model=_parent(), train_data=data, num_classes=NUM_CLASSES, epochs=2)
    with pytest.raises(ValueError, match="auxiliary"):
        method.on_train_start(ctx)
    with pytest.raises(ValueError, match="advbct needs a parent"):
        method.on_train_start(TrainContext(new_model=model, old_model=None, train_data=data,
                                           num_classes=NUM_CLASSES, epochs=2))


def test_every_class_with_images_gets_a_boundary_unseen_ones_included():
    data = LabelShiftedImages(n=40, num_classes=4, seed=3)
    method = AdvBCT()
    model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
    parent = _parent(seen=(0, 1))
    ctx = TrainContext(new_model=model, old_model=parent, train_data=data, num_classes=NUM_CLASSES, epochs=2)
    method.on_train_start(ctx)
    assert ctx.state["advbct/bounded"].tolist() == [True, True, True, True, False]
    out, labels = embed_dataset(parent, data)
    expected = old_class_boundaries(out.embedding, labels, NUM_CLASSES)
    torch.testing.assert_close(ctx.state["advbct/centres"], expected[0])
    torch.testing.assert_close(ctx.state["advbct/max_radii"], expected[2])


def test_seen_boundaries_cover_only_the_old_models_classes():
    """boundary_classes "seen" (the released code's old meta): classes 2 and 3, which the parent never
    saw, have no boundary; the centres and radii are the same as with "all"."""
    data = LabelShiftedImages(n=40, num_classes=4, seed=3)
    parent = _parent(seen=(0, 1))
    states = {}
    for classes in ("all", "seen"):
        method = AdvBCT({"boundary_classes": classes})
        model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
        ctx = TrainContext(new_model=model, old_model=parent, train_data=data, num_classes=NUM_CLASSES, epochs=2)
        method.on_train_start(ctx)
        states[classes] = ctx.state
    assert states["seen"]["advbct/bounded"].tolist() == [True, True, False, False, False]
    torch.testing.assert_close(states["seen"]["advbct/centres"], states["all"]["advbct/centres"])
    torch.testing.assert_close(states["seen"]["advbct/max_radii"], states["all"]["advbct/max_radii"])


def test_loss_terms_are_weighted_by_the_schedule():
    data = LabelShiftedImages(n=16, num_classes=4, seed=4)
    method = AdvBCT({"boundary_weight": 0.5, "adversarial_weight": 2.0, "threshold": 0.2})
    torch.manual_seed(3)
    model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
    parent = _parent()
    ctx = TrainContext(new_model=model, old_model=parent, train_data=data, num_classes=NUM_CLASSES, epochs=4, epoch=1)
    method.on_train_start(ctx)
    images, labels = data.images[:8], data.labels[:8]
    model.train()
    new = model(images)
    with torch.no_grad():
        old = parent(images)
    terms = method.loss(new, old, labels, ctx)
    assert set(terms) == {"base", "boundary", "adversarial"}
    aux = model.auxiliary
    radii = elastic_radii(ctx.state["advbct/max_radii"], 0.2, aux["elastic_boundary"].weight)
    expected_boundary = boundary_loss(new.embedding, labels, ctx.state["advbct/centres"], radii, ctx.state["advbct/bounded"])
    assert terms["boundary"].item() == pytest.approx(0.5 * expected_boundary.item(), rel=1e-6)
    expected_adv = adversarial_loss(aux["discriminator"], new.embedding, old.embedding, 0.0)
    assert terms["adversarial"].item() == pytest.approx(2.0 * (4 - 1 + 1) / 4 * expected_adv.item(), rel=1e-5)


def test_a_clipped_reversal_never_pushes_the_embeddings_harder_than_the_cross_entropy():
    """reversal_clip ρ: the adversarial term's gradient at the new embeddings has at most ρ times
    the norm of the cross-entropy's there; D's own gradient is not clipped."""
    data = LabelShiftedImages(n=16, num_classes=4, seed=4)
    parent = _parent()
    images, labels = data.images[:8], data.labels[:8]
    with torch.no_grad():
        old = parent(images)
    grads = {}
    for clip in (None, 0.1):
        method = AdvBCT({"reversal_clip": clip, "adversarial_weight": 50.0, "adversarial_warmup": 0.25})
        torch.manual_seed(3)
        model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
        ctx = TrainContext(new_model=model, old_model=parent, train_data=data, num_classes=NUM_CLASSES, epochs=4,
                           epoch=2)
        method.on_train_start(ctx)
        model.train()
        new = model(images)
        terms = method.loss(new, old, labels, ctx)
        discriminator = list(model.auxiliary["discriminator"].parameters())
        adversarial = torch.autograd.grad(terms["adversarial"], [new.embedding, *discriminator], retain_graph=True)
        base, = torch.autograd.grad(terms["base"], new.embedding)
        grads[clip] = (adversarial[0], adversarial[1:], base)
    unclipped, d_unclipped, base = grads[None]
    clipped, d_clipped, _ = grads[0.1]
    assert unclipped.norm() > 0.1 * base.norm()  # a large weight: the released reversal exceeds it
    assert clipped.norm() == pytest.approx(0.1 * base.norm().item(), rel=1e-4)
    torch.testing.assert_close(clipped / clipped.norm(), unclipped / unclipped.norm())
    for got, want in zip(d_clipped, d_unclipped):
        torch.testing.assert_close(got, want)


# --- checkpoints: the deployed generation has no training-only module ------------------------------
def test_a_saved_generation_leaves_the_auxiliary_modules_behind(tmp_path):
    data = LabelShiftedImages(n=16, num_classes=4)
    method = AdvBCT()
    torch.manual_seed(0)
    model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
    train_generation(method, model, data, data, TrainConfig(epochs=1, batch_size=8, augment=False), old_model=_parent())
    card = save_generation(model, method, None, str(tmp_path / "g1"), name="g1")
    import safetensors.torch
    saved = safetensors.torch.load((tmp_path / "g1" / "model.safetensors").read_bytes())
    assert not any(key.startswith("auxiliary.") for key in saved)
    assert set(saved) == set(model.deployable_state_dict())
    assert card.adapters == {}

    loaded, _ = load_generation(str(tmp_path / "g1"))
    assert len(loaded.auxiliary) == 0
    with torch.no_grad():
        torch.testing.assert_close(loaded(data.images).embedding, model.eval()(data.images).embedding)

    # a new AdvBCT generation started from it keeps its own fresh discriminator
    torch.manual_seed(5)
    child = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
    fresh = {k: v.clone() for k, v in child.auxiliary.state_dict().items()}
    child.load_generation_weights(loaded.deployable_state_dict())
    assert all(torch.equal(child.auxiliary.state_dict()[k], v) for k, v in fresh.items())
    assert torch.equal(child.encoder.projection.weight, loaded.encoder.projection.weight)
    with pytest.raises(RuntimeError, match="missing keys"):
        child.load_generation_weights({k: v for k, v in loaded.state_dict().items() if not k.startswith("head.")})


# --- DDP: the auxiliary modules are synchronised like the rest of the model ---------------------------
def _ddp_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        data = LabelShiftedImages(n=64, num_classes=4, seed=0)
        parent = _parent(num_classes=4, seen=(0, 1))
        method = AdvBCT({"threshold": 0.1})
        torch.manual_seed(2)
        model = method.build_model(_encoder(), 4, seen_classes=range(4))
        initial = {k: v.detach().clone() for k, v in model.named_parameters()}
        ddp = DistributedDataParallel(model)
        config = TrainConfig(epochs=2, batch_size=8, lr=0.05, weight_decay=0.0, augment=False)
        ctx = TrainContext(new_model=model, old_model=parent, train_data=data, num_classes=4, epochs=config.epochs)
        method.on_train_start(ctx)
        optimizer = build_optimizer(model, config)
        stats = []
        for epoch in range(config.epochs):
            ctx.epoch = epoch
            loader = make_train_loader(data, config, epoch, rank=rank, world_size=world_size)
            stats.append(train_one_epoch(method, ctx, loader, optimizer, config, forward_model=ddp))
        torch.save({"initial": initial, "final": {k: v.detach().clone() for k, v in model.named_parameters()},
                    "stats": stats}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.e2e
def test_auxiliary_modules_train_in_step_across_ddp_workers(tmp_path):
    """Two gloo processes run the loop's ``train_one_epoch`` with a DDP-wrapped AdvBCT model (as
    the Ray Train worker does): the discriminator and elastic weights, used in the loss rather
    than in ``forward``, still get their gradients all-reduced, so both ranks end identical."""
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert results[0]["stats"][0]["samples"] == 32  # each rank saw half of the 64 items
    for name, value in results[0]["final"].items():
        torch.testing.assert_close(value, results[1]["final"][name], rtol=0, atol=1e-6, msg=name)
    for name in ("auxiliary.discriminator.net.0.weight", "auxiliary.discriminator.net.3.bias",
                 "auxiliary.elastic_boundary.weight", "encoder.projection.weight"):
        assert not torch.equal(results[0]["final"][name], results[0]["initial"][name]), name
    for stats in results[0]["stats"]:
        assert stats["loss/adversarial"] > 0 and math.isfinite(stats["loss"])
