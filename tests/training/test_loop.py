"""The training loop of one generation: schedule, optimiser, loader, epoch statistics, hooks,
non-finite losses and determinism (orchestrator/training/{config,optim,loop}.py)."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from image_data import LabelShiftedImages
from orchestrator.methods import registry
from orchestrator.methods.hoc import HOC
from orchestrator.methods.independent import Independent
from orchestrator.methods.registry import create_method, register_method
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.config import TrainConfig
from orchestrator.training.loop import freeze, make_train_loader, train_generation
from orchestrator.training.optim import build_optimizer, learning_rate_factor, set_learning_rate

NUM_CLASSES = 3


def _images(n: int = 24, seed: int = 0) -> LabelShiftedImages:
    """n random 16x16 images of 3 classes (i % 3)."""
    return LabelShiftedImages(n=n, num_classes=NUM_CLASSES, seed=seed)


def _model(method, seed: int, **encoder):
    torch.manual_seed(seed)
    config = EncoderConfig(arch="test_resnet", embed_dim=8, small_input=False, **encoder)
    return method.build_model(config, NUM_CLASSES, seen_classes=torch.arange(NUM_CLASSES))


# --- schedule ---------------------------------------------------------------------------------
@pytest.mark.parametrize("epoch", [0, 1, 3, 5, 9])
def test_cosine_schedule(epoch):
    config = TrainConfig(epochs=10, lr=0.1)
    expected = 0.5 * (1.0 + math.cos(math.pi * epoch / 10))
    assert learning_rate_factor(epoch, config) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_cosine_schedule_endpoints_and_monotonicity():
    config = TrainConfig(epochs=4, lr=0.2)
    factors = [learning_rate_factor(e, config) for e in range(4)]
    assert factors[0] == 1.0
    assert factors == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4))])
    assert all(a > b for a, b in zip(factors, factors[1:]))
    assert learning_rate_factor(4, config) == pytest.approx(0.0, abs=1e-15)  # reached after the last epoch


@pytest.mark.parametrize("epoch", [0, 2, 7])
def test_cosine_schedule_with_min_lr_floor(epoch):
    config = TrainConfig(epochs=8, lr=0.1, min_lr=0.01)
    floor = 0.01 / 0.1
    expected = floor + (1 - floor) * 0.5 * (1.0 + math.cos(math.pi * epoch / 8))
    assert learning_rate_factor(epoch, config) == pytest.approx(expected, rel=1e-12)
    assert config.lr * learning_rate_factor(8, config) == pytest.approx(0.01, rel=1e-12)


def test_cosine_schedule_with_warmup():
    config = TrainConfig(epochs=10, lr=0.1, warmup_epochs=3)
    for epoch in range(3):  # linear warm-up (e + 1) / (W + 1)
        assert learning_rate_factor(epoch, config) == pytest.approx((epoch + 1) / 4, rel=1e-12)
    for epoch in range(3, 10):  # cosine over the remaining E − W epochs
        expected = 0.5 * (1.0 + math.cos(math.pi * (epoch - 3) / 7))
        assert learning_rate_factor(epoch, config) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert learning_rate_factor(3, config) == 1.0


def test_constant_schedule():
    config = TrainConfig(epochs=6, lr=0.05, schedule="constant")
    assert [learning_rate_factor(e, config) for e in range(6)] == [1.0] * 6
    warm = TrainConfig(epochs=6, lr=0.05, schedule="constant", warmup_epochs=2)
    assert [learning_rate_factor(e, warm) for e in range(6)] == pytest.approx([1 / 3, 2 / 3, 1, 1, 1, 1])


def test_set_learning_rate_applies_to_every_group():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 7.0}], lr=1.0)
    config = TrainConfig(epochs=4, lr=0.2)
    lr = set_learning_rate(optimizer, 2, config)
    assert lr == pytest.approx(0.2 * 0.5)
    assert [g["lr"] for g in optimizer.param_groups] == [lr, lr]


# --- optimiser --------------------------------------------------------------------------------
@pytest.mark.parametrize("name, cls", [("sgd", torch.optim.SGD), ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_build_optimizer_class_and_hyperparameters(name, cls):
    model = _model(Independent(), seed=0)
    config = TrainConfig(optimizer=name, lr=0.03, momentum=0.8, weight_decay=1e-3)
    optimizer = build_optimizer(model, config)
    assert type(optimizer) is cls
    group = optimizer.param_groups[0]
    assert group["lr"] == 0.03 and group["weight_decay"] == 1e-3
    if name == "sgd":
        assert group["momentum"] == 0.8 and group["nesterov"] is False
    params = [p for g in optimizer.param_groups for p in g["params"]]
    assert len(params) == len(list(model.parameters()))


def test_build_optimizer_takes_only_trainable_parameters():
    model = _model(Independent(), seed=0, freeze_backbone=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    assert trainable and frozen
    optimizer = build_optimizer(model, TrainConfig())
    params = [p for g in optimizer.param_groups for p in g["params"]]
    assert {id(p) for p in params} == {id(p) for p in trainable}
    assert len(params) == len(trainable)
    # backbone + projection + head: exactly the projection and the head train
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names == {"encoder.projection.weight", "encoder.projection.bias", "head.weight", "head.bias"}

    freeze(model)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer(model, TrainConfig())


# --- loader -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n, batch, sizes", [
    (20, 8, [8, 8]),        # last partial batch (4) dropped
    (16, 8, [8, 8]),
    (8, 8, [8]),
    (6, 8, [6]),            # no full batch: the partial one is kept
    (3, 2, [2]),
])
def test_make_train_loader_drops_the_last_partial_batch_only_with_a_full_one(n, batch, sizes):
    data = _images(n=n)
    config = TrainConfig(batch_size=batch)
    batches = list(make_train_loader(data, config, epoch=0))
    assert [len(b[2]) for b in batches] == sizes
    ids = torch.cat([b[2] for b in batches]).tolist()
    assert len(set(ids)) == len(ids) and set(ids) <= set(range(n))


def test_make_train_loader_is_a_seeded_shuffle():
    data = _images(n=24)

    def order(seed: int, epoch: int) -> list[int]:
        loader = make_train_loader(data, TrainConfig(batch_size=8, seed=seed), epoch=epoch)
        return torch.cat([b[2] for b in loader]).tolist()

    assert sorted(order(0, 0)) == list(range(24))
    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(0, 1)
    assert order(0, 0) != order(1, 0)
    assert order(0, 0) != list(range(24))


# --- train_generation -------------------------------------------------------------------------
def test_history_has_one_entry_per_epoch_with_the_total_the_sum_of_terms():
    data = _images(n=24)
    config = TrainConfig(epochs=3, batch_size=8, lr=0.05, augment=False)
    parent = _model(Independent(), seed=1)
    train_generation(Independent(), parent, data, data, config.model_copy(update={"epochs": 1}))
    method = HOC({"lam": 0.3})
    seen = []
    history = train_generation(method, _model(method, seed=2), data, data, config, old_model=parent,
                               on_epoch_end=lambda e, s: seen.append((e, dict(s))))
    assert len(history) == 3
    assert seen == [(e, s) for e, s in enumerate(history)]
    for epoch, stats in enumerate(history):
        assert set(stats) == {"loss", "loss/base", "loss/infonce", "samples", "epoch", "lr", "seconds"}
        assert stats["epoch"] == epoch and stats["samples"] == 24
        assert stats["lr"] == pytest.approx(0.05 * 0.5 * (1 + math.cos(math.pi * epoch / 3)), rel=1e-12)
        assert stats["seconds"] >= 0
        assert stats["loss"] == pytest.approx(stats["loss/base"] + stats["loss/infonce"], rel=1e-6)
    assert history[-1]["loss/base"] < history[0]["loss/base"]


def test_epoch_loss_is_the_sample_weighted_mean_of_batch_losses():
    """With a negligible learning rate the model does not move, so the epoch statistics can be
    recomputed independently from the loader's batches (last partial batch dropped)."""
    data = _images(n=20)
    config = TrainConfig(epochs=1, batch_size=8, lr=1e-12, momentum=0.0, weight_decay=0.0, augment=False)
    method = Independent()
    model = _model(method, seed=3)
    reference = copy.deepcopy(model).train()
    history = train_generation(method, model, data, data, config)
    assert history[0]["samples"] == 16  # 20 items, batches of 8: 4 dropped
    total, count = 0.0, 0
    with torch.no_grad():
        for images, labels, _ids in make_train_loader(data, config, epoch=0):
            logits = reference(images).logits.double()
            total += F.cross_entropy(logits, labels, reduction="sum").item()
            count += len(labels)
    assert count == 16
    assert history[0]["loss"] == pytest.approx(total / count, rel=1e-5)
    assert history[0]["loss/base"] == history[0]["loss"]


class _Recording(Independent):
    """Independent, recording its hook calls (not registered: train_generation needs no registry)."""

    name = "recording"

    def __init__(self, params=None):
        super().__init__(params)
        self.calls: list[tuple[str, int]] = []

    def on_train_start(self, ctx):
        self.calls.append(("start", ctx.epoch))

    def on_epoch_start(self, ctx):
        self.calls.append(("epoch", ctx.epoch))

    def on_train_end(self, ctx):
        self.calls.append(("end", ctx.epoch))
        assert ctx.new_model.training  # the loop puts the model in eval mode after this hook


def test_hooks_are_called_in_order_and_model_ends_in_eval_mode():
    method = _Recording()
    model = _model(method, seed=0)
    train_generation(method, model, _images(), _images(), TrainConfig(epochs=3, batch_size=8))
    assert method.calls == [("start", 0), ("epoch", 0), ("epoch", 1), ("epoch", 2), ("end", 2)]
    assert not model.training


@pytest.fixture
def nan_method():
    """A method registered under a unique name whose loss has a NaN term from epoch 1 on."""
    name = "_test_nan_loss"

    class NaNLoss(Independent):
        def loss(self, new, old, labels, ctx):
            terms = super().loss(new, old, labels, ctx)
            if ctx.epoch >= 1:
                terms["broken"] = torch.tensor(float("nan"))
            return terms

    NaNLoss.name = name
    register_method(NaNLoss)
    try:
        yield create_method(name)
    finally:
        del registry._METHODS[name]


def test_non_finite_loss_raises_naming_the_method(nan_method):
    model = _model(nan_method, seed=0)
    ended = []
    config = TrainConfig(epochs=3, batch_size=8, lr=0.05)
    original = {}

    def snapshot(epoch, stats):
        ended.append(epoch)
        original.update({k: v.clone() for k, v in model.state_dict().items()})

    with pytest.raises(FloatingPointError, match=r"method '_test_nan_loss': non-finite loss at epoch 1: .*broken=nan"):
        train_generation(nan_method, model, _images(), _images(), config, on_epoch_end=snapshot)
    assert ended == [0]
    # the NaN batch made no optimisation step
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in original.items() if v.is_floating_point() and "running" not in k)
    assert "_test_nan_loss" in registry._METHODS


def test_nan_method_is_unregistered_afterwards():
    assert "_test_nan_loss" not in registry._METHODS


def _strip(history):
    return [{k: v for k, v in stats.items() if k != "seconds"} for stats in history]


def test_same_seed_same_history():
    data = _images(n=24)
    config = TrainConfig(epochs=2, batch_size=8, lr=0.05, seed=5)
    runs = []
    for _ in range(2):
        parent = _model(Independent(), seed=1)
        train_generation(Independent(), parent, data, data, config.model_copy(update={"epochs": 1}))
        method = create_method("l2", {"lam": 0.5})
        model = _model(method, seed=2)
        runs.append((train_generation(method, model, data, data, config, old_model=parent), model))
    (first, model_a), (second, model_b) = runs
    assert _strip(first) == _strip(second)
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)

    # another seed shuffles differently, hence another history
    parent = _model(Independent(), seed=1)
    train_generation(Independent(), parent, data, data, config.model_copy(update={"epochs": 1}))
    method = create_method("l2", {"lam": 0.5})
    other = train_generation(method, _model(method, seed=2), data, data, config.model_copy(update={"seed": 6}),
                             old_model=parent)
    assert _strip(other) != _strip(first)
