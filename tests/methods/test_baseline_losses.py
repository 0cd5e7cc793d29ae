"""The Euclidean baselines of HBCT §13 (ℓ2, BCT, Hot-Refresh, HOC; HOC as in stationary_dsimplex.md
§5.4), each checked against an independent float64 computation written with explicit loops."""
from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import Subset

from image_data import LabelShiftedImages
from orchestrator.methods.base import TrainContext, embed_dataset
from orchestrator.methods.bct import BCT
from orchestrator.methods.hoc import HOC, hoc_infonce
from orchestrator.methods.hot_refresh import HotRefresh, ract_loss
from orchestrator.methods.independent import Independent
from orchestrator.methods.l2 import L2Regression
from orchestrator.models.encoder import EncoderConfig
from orchestrator.models.outputs import ModelOutput
from orchestrator.training.config import TrainConfig
from orchestrator.training.loop import freeze, train_generation

LABEL_SETS = {
    "mixed": [0, 1, 0, 2, 1, 3, 0, 2],
    "distinct": [0, 1, 2, 3, 4, 5, 6, 7],
    "one_class": [3, 3, 3, 3, 3, 3, 3, 3],
}


# --- float64 references -----------------------------------------------------------------------
def _norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def _unit(v: list[float]) -> list[float]:
    n = _norm(v)
    return [x / n for x in v]


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def _cos(a: list[float], b: list[float]) -> float:
    return _dot(a, b) / (_norm(a) * _norm(b))


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def _cross_entropy(logits: list[list[float]], labels: list[int]) -> float:
    return sum(_logsumexp(row) - row[y] for row, y in zip(logits, labels)) / len(labels)


def _rows(t: torch.Tensor) -> list[list[float]]:
    return t.detach().double().tolist()


def _random_output(generator: torch.Generator, batch: int = 8, dim: int = 6, classes: int = 8) -> ModelOutput:
    features = torch.randn(batch, dim, generator=generator) * 2.0
    embedding = torch.randn(batch, dim, generator=generator) * 3.0 + 0.5  # deliberately not unit, not features
    logits = torch.randn(batch, classes, generator=generator)
    return ModelOutput(features=features, embedding=embedding, logits=logits)


# --- ℓ2 -----------------------------------------------------------------------------------------
def _l2_reference(new: ModelOutput, old: ModelOutput, space: str) -> float:
    if space == "cosine":
        a, b = [_unit(r) for r in _rows(new.embedding)], [_unit(r) for r in _rows(old.embedding)]
    else:
        a, b = _rows(new.features), _rows(old.features)
    total = 0.0
    for u, v in zip(a, b):
        total += sum((x - y) ** 2 for x, y in zip(u, v))
    return total / len(a)


@pytest.mark.parametrize("space", ["cosine", "euclidean", "lorentz"])
def test_l2_regression_term(space):
    g = torch.Generator().manual_seed(1)
    new, old = _random_output(g), _random_output(g)
    labels = torch.tensor(LABEL_SETS["mixed"])
    expected_reg = _l2_reference(new, old, space)
    expected_ce = _cross_entropy(_rows(new.logits), labels.tolist())

    terms = L2Regression({"space": space}).loss(new, old, labels, ctx=None)
    assert set(terms) == {"base", "l2"}
    assert terms["l2"].item() == pytest.approx(expected_reg, rel=1e-5)
    assert terms["base"].item() == pytest.approx(expected_ce, rel=1e-5)

    # λ scales the regression term only
    scaled = L2Regression({"space": space, "lam": 0.37}).loss(new, old, labels, ctx=None)
    assert scaled["l2"].item() == pytest.approx(0.37 * expected_reg, rel=1e-5)
    assert scaled["base"].item() == pytest.approx(expected_ce, rel=1e-5)
    assert L2Regression({"space": space, "lam": 0.0}).loss(new, old, labels, ctx=None)["l2"].item() == 0.0


def test_l2_cosine_ignores_norms_euclidean_does_not():
    g = torch.Generator().manual_seed(2)
    out = _random_output(g)
    stretched = ModelOutput(features=out.features * 3.0, embedding=out.embedding * 3.0, logits=out.logits)
    labels = torch.tensor(LABEL_SETS["mixed"])
    assert L2Regression({"space": "cosine"}).loss(stretched, out, labels, None)["l2"].item() == pytest.approx(0.0, abs=1e-10)
    expected = _l2_reference(stretched, out, "euclidean")  # = 4·mean‖f‖²
    assert expected > 1.0
    assert L2Regression({"space": "euclidean"}).loss(stretched, out, labels, None)["l2"].item() == pytest.approx(expected, rel=1e-5)


def test_l2_needs_a_parent_and_matching_shapes():
    g = torch.Generator().manual_seed(3)
    new = _random_output(g)
    labels = torch.tensor(LABEL_SETS["mixed"])
    with pytest.raises(ValueError, match="'l2' needs the parent"):
        L2Regression().loss(new, None, labels, None)
    old = ModelOutput(features=new.features[:, :4], embedding=new.embedding[:, :4], logits=new.logits)
    with pytest.raises(ValueError, match="differ in shape"):
        L2Regression().loss(new, old, labels, None)


# --- Hot-Refresh --------------------------------------------------------------------------------
def _ract_reference(new: torch.Tensor, old: torch.Tensor, labels: list[int], tau: float) -> float:
    n, o = _rows(new), _rows(old)
    total = 0.0
    for i in range(len(labels)):
        positive = _cos(n[i], o[i]) / tau
        negatives = []
        for j in range(len(labels)):
            if labels[j] != labels[i]:
                negatives.append(_cos(n[i], o[j]) / tau)
                negatives.append(_cos(n[i], n[j]) / tau)
        total += -positive + _logsumexp([positive] + negatives)
    return total / len(labels)


@pytest.mark.parametrize("label_set", sorted(LABEL_SETS))
@pytest.mark.parametrize("tau", [0.5, 1.0])
def test_ract_loss_matches_a_per_anchor_loop(label_set, tau):
    g = torch.Generator().manual_seed(4)
    new, old = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
    labels = torch.tensor(LABEL_SETS[label_set])
    expected = _ract_reference(new, old, labels.tolist(), tau)
    assert ract_loss(new, old, labels, tau).item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    if label_set == "one_class":
        assert expected == 0.0  # no negatives: only the positive is in the denominator
    # scale invariant (cosine), and not symmetric in new / old
    assert ract_loss(4.0 * new, 0.5 * old, labels, tau).item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    if label_set != "one_class":
        swapped = _ract_reference(old, new, labels.tolist(), tau)
        assert abs(swapped - expected) > 1e-3


def test_hot_refresh_method_weights_the_contrastive_term():
    g = torch.Generator().manual_seed(5)
    new, old = _random_output(g), _random_output(g)
    labels = torch.tensor(LABEL_SETS["mixed"])
    terms = HotRefresh({"lam": 0.4, "tau": 1.0}).loss(new, old, labels, None)
    assert set(terms) == {"base", "contrastive"}
    expected = 0.4 * _ract_reference(new.embedding, old.embedding, labels.tolist(), 1.0)
    assert terms["contrastive"].item() == pytest.approx(expected, rel=1e-5)
    assert terms["base"].item() == pytest.approx(_cross_entropy(_rows(new.logits), labels.tolist()), rel=1e-5)
    with pytest.raises(ValueError, match="'hot_refresh' needs the parent"):
        HotRefresh().loss(new, None, labels, None)


# --- HOC --------------------------------------------------------------------------------------
def _hoc_reference(old: torch.Tensor, new: torch.Tensor, labels: list[int], tau: float) -> float:
    o, n = _rows(old), _rows(new)
    total = 0.0
    for i in range(len(labels)):
        s = [tau * _cos(o[i], n[j]) for j in range(len(labels))]
        masked = [s[j] if labels[j] != labels[i] else 0.0 for j in range(len(labels))]
        total += -s[i] + _logsumexp(masked)
    return total / len(labels)


@pytest.mark.parametrize("label_set", sorted(LABEL_SETS))
@pytest.mark.parametrize("tau", [1.0, 10.0])
def test_hoc_infonce_matches_the_released_code_loop(label_set, tau):
    g = torch.Generator().manual_seed(6)
    old, new = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
    labels = torch.tensor(LABEL_SETS[label_set])
    expected = _hoc_reference(old, new, labels.tolist(), tau)
    assert hoc_infonce(old, new, labels, tau).item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    if label_set == "one_class":
        # every logit zeroed: −s_ii + log B
        diag = sum(tau * _cos(a, b) for a, b in zip(_rows(old), _rows(new))) / 8
        assert expected == pytest.approx(-diag + math.log(8), rel=1e-12)
    else:
        # old is the anchor, new the contrast set: swapping them changes the value
        assert abs(_hoc_reference(new, old, labels.tolist(), tau) - expected) > 1e-3


@pytest.mark.parametrize("lam", [0.1, 0.75])
def test_hoc_method_weights_ce_by_lambda_and_infonce_by_one_minus_lambda(lam):
    g = torch.Generator().manual_seed(7)
    new, old = _random_output(g), _random_output(g)
    labels = torch.tensor(LABEL_SETS["mixed"])
    terms = HOC({"lam": lam, "tau": 5.0}).loss(new, old, labels, None)
    assert set(terms) == {"base", "infonce"}
    ce = _cross_entropy(_rows(new.logits), labels.tolist())
    nce = _hoc_reference(old.embedding, new.embedding, labels.tolist(), 5.0)
    assert terms["base"].item() == pytest.approx(lam * ce, rel=1e-5)
    assert terms["infonce"].item() == pytest.approx((1.0 - lam) * nce, rel=1e-5)
    with pytest.raises(ValueError, match="'hoc' needs the parent"):
        HOC().loss(new, None, labels, None)


# --- BCT --------------------------------------------------------------------------------------
NUM_CLASSES = 6  # the new generation's label space; class 5 has no training image
OLD_CLASSES = [0, 1, 2]


def _images(seed: int = 0) -> LabelShiftedImages:
    """40 random 16x16 images of classes 0..4 (i % 5)."""
    return LabelShiftedImages(n=40, num_classes=5, seed=seed)


def _encoder() -> EncoderConfig:
    return EncoderConfig(arch="test_resnet", embed_dim=8, small_input=False)


def _bct_setup(parent_head_classes: int, lam: float = 0.7):
    data = _images()
    old_items = [i for i in range(len(data)) if int(data.labels[i]) in OLD_CLASSES]
    old_data = Subset(data, old_items)
    parent_method = Independent()
    torch.manual_seed(1)
    parent = parent_method.build_model(_encoder(), parent_head_classes, seen_classes=OLD_CLASSES)
    train_generation(parent_method, parent, old_data, old_data, TrainConfig(epochs=1, batch_size=8, lr=0.05))
    freeze(parent)

    method = BCT({"lam": lam})
    torch.manual_seed(2)
    model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(5))
    ctx = TrainContext(new_model=model, old_model=parent, train_data=data, num_classes=NUM_CLASSES, batch_size=16)
    method.on_train_start(ctx)
    return data, parent, model, method, ctx


def _expected_old_classifier(parent, data) -> tuple[list[list[float]], list[float]]:
    out, labels = embed_dataset(parent, data, batch_size=7)
    emb, labels = _rows(out.embedding), labels.tolist()
    trained_w, trained_b = _rows(parent.head.weight), parent.head.bias.detach().double().tolist()
    mean_norm = sum(_norm(trained_w[c]) for c in OLD_CLASSES) / len(OLD_CLASSES)
    weight = [[0.0] * len(emb[0]) for _ in range(NUM_CLASSES)]
    bias = [0.0] * NUM_CLASSES
    for c in range(NUM_CLASSES):
        if c in OLD_CLASSES:
            weight[c], bias[c] = trained_w[c], trained_b[c]
            continue
        members = [emb[i] for i in range(len(labels)) if labels[i] == c]
        if not members:
            continue  # absent from the training set: a zero row
        mean = [sum(col) / len(members) for col in zip(*members)]
        weight[c] = [x * mean_norm for x in _unit(mean)]
    return weight, bias


@pytest.mark.parametrize("parent_head_classes", [NUM_CLASSES, len(OLD_CLASSES)])
def test_bct_synthesises_the_old_classifier(parent_head_classes):
    data, parent, _model, _method, ctx = _bct_setup(parent_head_classes)
    weight, bias = ctx.state["bct_old_classifier"]
    assert weight.shape == (NUM_CLASSES, 8) and bias.shape == (NUM_CLASSES,)
    # trained rows are copied exactly
    for c in OLD_CLASSES:
        assert torch.equal(weight[c], parent.head.weight[c]) and torch.equal(bias[c], parent.head.bias[c])
    expected_w, expected_b = _expected_old_classifier(parent, data)
    torch.testing.assert_close(weight.double(), torch.tensor(expected_w, dtype=torch.float64), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bias.double(), torch.tensor(expected_b, dtype=torch.float64), rtol=1e-5, atol=1e-6)
    # synthesised rows are on the trained rows' scale, the absent class is a zero row
    mean_norm = sum(_norm(expected_w[c]) for c in OLD_CLASSES) / 3
    for c in (3, 4):
        assert weight[c].norm().item() == pytest.approx(mean_norm, rel=1e-5)
        if parent_head_classes == NUM_CLASSES:  # the parent's own (untrained-class) rows are not used
            assert not torch.allclose(weight[c], parent.head.weight[c])
    assert torch.count_nonzero(weight[5]) == 0 and bias[5] == 0


def test_bct_influence_term_goes_through_the_synthesised_old_classifier():
    lam = 0.7
    data, parent, model, method, ctx = _bct_setup(NUM_CLASSES, lam=lam)
    expected_w, expected_b = _expected_old_classifier(parent, data)
    images = torch.stack([data[i][0] for i in range(12)])
    labels = torch.stack([data[i][1] for i in range(12)])
    new = model(images)
    with torch.no_grad():
        old = parent(images)
    terms = method.loss(new, old, labels, ctx)
    assert set(terms) == {"base", "influence"}

    emb = _rows(new.embedding)
    logits = [[_dot(e, w) + b for w, b in zip(expected_w, expected_b)] for e in emb]
    expected_influence = lam * _cross_entropy(logits, labels.tolist())
    assert terms["influence"].item() == pytest.approx(expected_influence, rel=1e-5)
    assert terms["base"].item() == pytest.approx(_cross_entropy(_rows(new.logits), labels.tolist()), rel=1e-5)

    # the influence gradient reaches the new encoder, never the synthesised classifier
    terms["influence"].backward()
    assert model.encoder.projection.weight.grad.abs().sum() > 0
    assert model.head.weight.grad is None
    weight, _ = ctx.state["bct_old_classifier"]
    assert not weight.requires_grad


def test_bct_needs_a_parent():
    method = BCT()
    torch.manual_seed(0)
    model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(5))
    ctx = TrainContext(new_model=model, old_model=None, train_data=_images(), num_classes=NUM_CLASSES)
    with pytest.raises(ValueError, match="bct needs a parent"):
        method.on_train_start(ctx)
