"""HBCT method: entailment cone, RINCE, loss assembly, gradients and parent checks (hbct.md §4-§8)."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from orchestrator.geometry import lorentz
from orchestrator.methods import references
from orchestrator.methods.base import TrainContext
from orchestrator.methods.hbct import HBCT, contrastive_distances, entailment_loss, infonce_loss, rince_loss
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.heads import LorentzMLR
from orchestrator.models.lifts import build_lift
from orchestrator.models.outputs import ModelOutput
from orchestrator.training.config import TrainConfig
from orchestrator.training.loop import freeze, train_generation
from vector_models import VectorEncoder, vector_model


def make_model(method, in_dim: int = 8, embed_dim: int = 6, num_classes: int = 3, seed: int = 0) -> CompatibleModel:
    return vector_model(method, in_dim, embed_dim, num_classes, seed)


def make_ctx(new_model, old_model=None, num_classes: int = 3) -> TrainContext:
    data = TensorDataset(torch.zeros(1, 8), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    return TrainContext(new_model=new_model, old_model=old_model, train_data=data, num_classes=num_classes)


def lorentz_output(tangent: torch.Tensor, curv: float = 1.0, num_classes: int = 3) -> ModelOutput:
    logits = torch.linspace(-1.0, 1.0, tangent.shape[0] * num_classes).reshape(tangent.shape[0], num_classes)
    return ModelOutput(tangent, lorentz.expmap0(tangent, curv), logits.to(tangent.dtype))


# --- entailment cone (§6) -------------------------------------------------------------------


def reference_entailment(z_old: np.ndarray, z_new: np.ndarray, curv: float, eps: float) -> np.ndarray:
    """Per-pair max(0, ext − aper) from the hyperbolic law of cosines in the triangle (O, h_o, h_n)."""
    sk = math.sqrt(curv)
    c = sk * np.linalg.norm(z_old, axis=1)  # scaled side O–h_o
    a = sk * np.linalg.norm(z_new, axis=1)  # scaled side O–h_n
    cos_theta = (z_old * z_new).sum(1) / (np.linalg.norm(z_old, axis=1) * np.linalg.norm(z_new, axis=1))
    b = np.arccosh(np.cosh(c) * np.cosh(a) - np.sinh(c) * np.sinh(a) * cos_theta)  # scaled side h_o–h_n
    angle_at_old = np.arccos((np.cosh(c) * np.cosh(b) - np.cosh(a)) / (np.sinh(c) * np.sinh(b)))
    exterior = np.pi - angle_at_old
    aperture = np.arcsin(np.minimum(2 * eps / np.sinh(c), 1.0))
    return np.maximum(exterior - aperture, 0.0)


@pytest.mark.parametrize("curv", [1.0, 2.0])
def test_entailment_is_zero_inside_the_cone(curv):
    torch.manual_seed(0)
    z_old = torch.randn(16, 5, dtype=torch.float64)
    z_old = z_old / z_old.norm(dim=1, keepdim=True) * torch.linspace(0.5, 1.0, 16, dtype=torch.float64).unsqueeze(1)
    old = lorentz.expmap0(z_old, curv)
    further_out = lorentz.expmap0(1.3 * z_old, curv)
    assert entailment_loss(old, further_out, curv, 0.1).item() == 0.0
    # a small sideways step that stays inside the aperture is also free
    sideways = torch.randn(16, 5, dtype=torch.float64)
    sideways -= (sideways * z_old).sum(1, keepdim=True) / (z_old * z_old).sum(1, keepdim=True) * z_old
    nudged = 1.3 * z_old + 1e-3 * sideways / sideways.norm(dim=1, keepdim=True)
    assert entailment_loss(old, lorentz.expmap0(nudged, curv), curv, 0.1).item() == 0.0


@pytest.mark.parametrize("curv", [1.0, 2.0])
def test_entailment_outside_the_cone_matches_law_of_cosines(curv):
    torch.manual_seed(1)
    z_old = torch.randn(32, 5, dtype=torch.float64)
    z_old = z_old / z_old.norm(dim=1, keepdim=True) * 0.9
    z_new = torch.randn(32, 5, dtype=torch.float64) * 0.5
    expected = reference_entailment(z_old.numpy(), z_new.numpy(), curv, 0.1)
    assert (expected > 0).sum() >= 16  # most random pairs are outside the narrow cone
    got = entailment_loss(lorentz.expmap0(z_old, curv), lorentz.expmap0(z_new, curv), curv, 0.1)
    assert got.item() > 0
    np.testing.assert_allclose(got.item(), expected.mean(), rtol=1e-7)


def test_entailment_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="same shape"):
        entailment_loss(torch.zeros(4, 6), torch.zeros(4, 5), 1.0)


# --- RINCE (§7) -----------------------------------------------------------------------------


def random_distances(batch: int = 6, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(0.0, 6.0, size=(batch, batch))


def test_rince_general_q_matches_printed_equation():
    d = random_distances()
    q = np.array([0.05, 0.2, 0.4, 0.6, 0.8, 1.0])
    beta = 0.01
    pos = np.exp(-np.diag(d))
    neg = np.exp(-d).sum(1)
    expected = np.mean(-pos**q / q + (beta * neg) ** q / q)
    got = rince_loss(torch.tensor(d), torch.tensor(q), beta)
    np.testing.assert_allclose(got.item(), expected, rtol=1e-12)


@pytest.mark.parametrize("dtype, q_value, rtol", [(torch.float64, 1e-6, 1e-5), (torch.float64, 0.0, 1e-14), (torch.float32, 1e-6, 1e-5)])
def test_rince_tends_to_infonce_with_log_beta(dtype, q_value, rtol):
    d = random_distances(seed=3)
    beta = 0.01
    pos = np.exp(-np.diag(d))
    expected = np.mean(-np.log(pos) + np.log(beta * np.exp(-d).sum(1)))
    got = rince_loss(torch.tensor(d, dtype=dtype), torch.full((6,), q_value, dtype=dtype), beta)
    np.testing.assert_allclose(got.item(), expected, rtol=rtol)


def test_rince_at_q_one_is_closed_form():
    d = random_distances(seed=4)
    beta = 0.05
    expected = np.mean(-np.exp(-np.diag(d)) + beta * np.exp(-d).sum(1))
    got = rince_loss(torch.tensor(d), torch.ones(6, dtype=torch.float64), beta)
    np.testing.assert_allclose(got.item(), expected, rtol=1e-13)


def test_infonce_matches_reference():
    d = random_distances(seed=5)
    logits = -d
    expected = np.mean(-np.diag(logits) + np.log(np.exp(logits).sum(1)))
    np.testing.assert_allclose(infonce_loss(torch.tensor(d)).item(), expected, rtol=1e-12)


def test_rince_input_validation():
    with pytest.raises(ValueError, match="distances"):
        rince_loss(torch.zeros(3, 4), torch.ones(3), 0.01)
    with pytest.raises(ValueError, match="q must be"):
        rince_loss(torch.zeros(3, 3), torch.ones(4), 0.01)
    with pytest.raises(ValueError, match="beta"):
        rince_loss(torch.zeros(3, 3), torch.ones(3), 0.0)


def test_contrastive_distance_variants_match_lorentz_formulas():
    torch.manual_seed(2)
    curv = 0.7
    new = lorentz.expmap0(torch.randn(5, 4, dtype=torch.float64), curv)
    old = lorentz.expmap0(torch.randn(5, 4, dtype=torch.float64), curv)
    inner = lorentz.pairwise_inner(new, old)
    geodesic = torch.arccosh(-curv * inner) / math.sqrt(curv)
    torch.testing.assert_close(contrastive_distances(new, old, curv, "geodesic"), geodesic)
    torch.testing.assert_close(contrastive_distances(new, old, curv, "squared"), -2 / curv - 2 * inner)
    torch.testing.assert_close(contrastive_distances(new, old, curv, "lorentz_inner"), -inner - 1 / curv)


# --- the method's loss (§8) -----------------------------------------------------------------


def paired_outputs(batch: int = 8, dim: int = 5, seed: int = 0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    z_old = torch.randn(batch, dim, generator=generator, dtype=dtype) * 0.4
    z_new = z_old + 0.3 * torch.randn(batch, dim, generator=generator, dtype=dtype)
    labels = torch.arange(batch) % 3
    return lorentz_output(z_new), lorentz_output(z_old), labels


def test_defaults_and_space():
    method = HBCT()
    p = method.params
    assert (p.curv, p.clip, p.lam, p.entail_weight, p.min_radius, p.beta, p.tau) == (1.0, 1.2, 0.3, 1.0, 0.1, 0.01, 0.5)
    assert p.contrastive == "rince" and p.entail and p.distance == "geodesic"
    assert method.space.value == "lorentz" and not HBCT.requires_parent
    lift = method.build_lift()
    assert lift.space.value == "lorentz" and lift.clip == 1.2 and lift.curv == 1.0
    assert isinstance(method.build_head(6, 4), LorentzMLR)
    with pytest.raises(ValueError):
        HBCT({"unknown": 1})


def test_base_only_without_parent():
    new, _old, labels = paired_outputs()
    terms = HBCT().loss(new, None, labels, ctx=None)
    assert set(terms) == {"base"}
    expected = torch.nn.functional.cross_entropy(new.logits, labels)
    torch.testing.assert_close(terms["base"], expected)


def test_terms_are_weighted_components():
    new, old, labels = paired_outputs()
    method = HBCT({"lam": 0.3, "entail_weight": 2.0})
    terms = method.loss(new, old, labels, ctx=None)
    assert set(terms) == {"base", "entailment", "contrastive"}
    entail = entailment_loss(old.embedding, new.embedding, 1.0, 0.1)
    distances = lorentz.pairwise_distance(new.embedding, old.embedding, 1.0) / 0.5
    q = lorentz.uncertainty(old.embedding, 1.0)
    contrast = rince_loss(distances, q, 0.01)
    assert entail.item() > 0
    torch.testing.assert_close(terms["entailment"], 0.3 * 2.0 * entail)
    torch.testing.assert_close(terms["contrastive"], 0.3 * contrast)
    # q_i is the old embedding's uncertainty 1 - tanh(||z_o||) (K = 1)
    torch.testing.assert_close(q, 1 - torch.tanh(old.features.norm(dim=1)))


def test_terms_scale_linearly_with_lambda():
    new, old, labels = paired_outputs()
    low = HBCT({"lam": 0.1}).loss(new, old, labels, ctx=None)
    high = HBCT({"lam": 0.7}).loss(new, old, labels, ctx=None)
    torch.testing.assert_close(high["base"], low["base"])
    for name in ("entailment", "contrastive"):
        torch.testing.assert_close(high[name], 7.0 * low[name])


def test_entail_false_removes_the_entailment_term():
    new, old, labels = paired_outputs()
    with_cone = HBCT().loss(new, old, labels, ctx=None)
    without = HBCT({"entail": False}).loss(new, old, labels, ctx=None)
    assert set(without) == {"base", "contrastive"}
    torch.testing.assert_close(without["contrastive"], with_cone["contrastive"])


def test_infonce_variant_uses_geodesic_logits():
    new, old, labels = paired_outputs()
    terms = HBCT({"contrastive": "infonce", "tau": 0.25}).loss(new, old, labels, ctx=None)
    d = lorentz.pairwise_distance(new.embedding, old.embedding, 1.0).numpy() / 0.25
    expected = np.mean(np.diag(d) + np.log(np.exp(-d).sum(1)))
    np.testing.assert_allclose(terms["contrastive"].item(), 0.3 * expected, rtol=1e-10)


def test_q_min_floors_the_exponent():
    # far-out old points have uncertainty ~ 0; the floor makes q = q_min exactly
    z_old = torch.full((4, 3), 6.0, dtype=torch.float64)
    new, old = lorentz_output(z_old * 0.9), lorentz_output(z_old)
    labels = torch.arange(4) % 3
    terms = HBCT({"q_min": 0.2, "entail": False}).loss(new, old, labels, ctx=None)
    distances = lorentz.pairwise_distance(new.embedding, old.embedding, 1.0) / 0.5
    expected = rince_loss(distances, torch.full((4,), 0.2, dtype=torch.float64), 0.01)
    torch.testing.assert_close(terms["contrastive"], 0.3 * expected)


def test_contrastive_gradient_is_finite_even_for_identical_points():
    _new, old, labels = paired_outputs(dtype=torch.float32)
    for start in (old.features.clone(), old.features + 0.1):
        tangent = start.clone().float().requires_grad_(True)
        new = ModelOutput(tangent, lorentz.expmap0(tangent, 1.0), torch.zeros(8, 3))
        old32 = ModelOutput(old.features.float(), old.embedding.float(), None)
        terms = HBCT().loss(new, old32, labels, ctx=None)
        sum(terms.values()).backward()
        assert torch.isfinite(tangent.grad).all()
        assert tangent.grad.abs().sum() > 0


def test_loss_trains_the_encoder_and_never_the_old_model():
    old_method, new_method = HBCT({"clip": 1.0}), HBCT()
    old_model = make_model(old_method, seed=1)
    new_model = make_model(new_method, seed=2)
    x = torch.randn(12, 8)
    labels = torch.arange(12) % 3
    # the old forward even runs WITH autograd here: the loss itself must not reach the parent
    old_out = old_model(x)
    new_out = new_model(x)
    terms = new_method.loss(new_out, old_out, labels, make_ctx(new_model, old_model))
    sum(terms.values()).backward()
    assert all(p.grad is None for p in old_model.parameters())
    assert new_model.encoder.proj.weight.grad is not None
    assert torch.isfinite(new_model.encoder.proj.weight.grad).all()
    assert new_model.encoder.proj.weight.grad.abs().sum() > 0
    # the alignment terms alone also reach the encoder
    new_model.zero_grad()
    new_out = new_model(x)
    terms = new_method.loss(new_out, old_model(x), labels, make_ctx(new_model, old_model))
    (terms["entailment"] + terms["contrastive"]).backward()
    assert new_model.encoder.proj.weight.grad.abs().sum() > 0
    assert new_model.head.z.grad is None or new_model.head.z.grad.abs().sum() == 0


def test_train_generation_with_frozen_parent():
    torch.manual_seed(0)
    x = torch.randn(48, 8)
    labels = torch.arange(48) % 3
    data = TensorDataset(x, labels, torch.arange(48))
    config = TrainConfig(epochs=2, batch_size=16, lr=0.05)
    old_method = HBCT({"clip": 1.0})
    old_model = make_model(old_method, seed=1)
    first = train_generation(old_method, old_model, data, data, config)
    assert set(first[0]) >= {"loss", "loss/base"} and "loss/contrastive" not in first[0]
    before = copy.deepcopy(old_model.state_dict())
    new_method = HBCT()
    history = train_generation(new_method, make_model(new_method, seed=2), data, data, config, old_model=old_model)
    assert {"loss/base", "loss/entailment", "loss/contrastive"} <= set(history[-1])
    assert all(math.isfinite(h["loss"]) for h in history)
    for name, tensor in old_model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


# --- issue 14 options: learned logit scale, λ warm-up ------------------------------------------


@pytest.mark.parametrize("epoch, expected", [(0, 0.0), (1, 0.48), (2, 0.96), (3, 1.2), (4, 1.2), (9, 1.2)])
def test_lam_warmup_ramps_lambda_linearly_over_the_fraction_of_the_epochs(epoch, expected):
    """λ = 1.2, warm-up over 0.25 of 10 epochs = 2.5 epochs: λ_e = 1.2 · min(1, e / 2.5)."""
    method = HBCT({"lam": 1.2, "lam_warmup": 0.25})
    assert method.lam_at(epoch, 10) == pytest.approx(expected)


def test_lam_warmup_weights_the_alignment_terms_of_that_epoch():
    new, old, labels = paired_outputs()
    plain = HBCT({"lam": 1.0}).loss(new, old, labels, ctx=None)
    method = HBCT({"lam": 1.0, "lam_warmup": 0.5})
    model = make_model(method)
    ctx = make_ctx(model, model)
    ctx.epoch, ctx.epochs = 3, 10  # λ_3 = min(1, 3 / 5) = 0.6
    warm = method.loss(new, old, labels, ctx)
    torch.testing.assert_close(warm["base"], plain["base"])
    for name in ("entailment", "contrastive"):
        torch.testing.assert_close(warm[name], 0.6 * plain[name])
    assert HBCT({"lam": 1.0}).lam_at(None, None) == 1.0  # no warm-up: the epoch is not needed
    with pytest.raises(ValueError, match="lam_warmup=0.5 needs the epoch and the training length.*epochs=None"):
        method.loss(new, old, labels, ctx=None)


def test_learned_logit_scale_is_in_the_head_and_is_trained():
    """mlr_learn_scale (the default, capped at 1.5) builds the MLR with a log-scale parameter;
    training moves it (it receives the base loss's gradient); the paper's head (false) has none."""
    assert HBCT({"mlr_learn_scale": False}).build_head(6, 3).log_scale is None
    assert HBCT().build_head(6, 3).max_log_scale == pytest.approx(math.log(1.5))
    assert HBCT({"mlr_max_scale": 4.0}).build_head(6, 3).max_log_scale == pytest.approx(math.log(4.0))
    method = HBCT({"clip": 1.0, "mlr_max_scale": 3.0})
    model = make_model(method, seed=1)
    assert isinstance(model.head, LorentzMLR) and model.head.log_scale.item() == 0.0
    torch.manual_seed(0)
    x = torch.randn(48, 8)
    labels = torch.arange(48) % 3
    data = TensorDataset(x + labels[:, None].float(), labels, torch.arange(48))
    train_generation(method, model, data, data, TrainConfig(epochs=3, batch_size=16, lr=0.05))
    assert model.head.log_scale.item() > 0.01  # separable classes: a larger logit scale lowers the CE


def test_parent_and_reference_keep_the_base_fields_and_drop_the_alignment_ones():
    """Updates that differ only in their alignment settings share one old model and one φ_*."""
    method = HBCT({"lam": 1.0, "lam_warmup": 0.5, "tau": 0.7, "entail": False, "clip": 1.4,
                   "mlr_init_scale": 10.0, "mlr_learn_scale": True, "mlr_max_scale": 4.0, "curv": 0.5})
    base = {"curv": 0.5, "mlr_init_scale": 10.0, "mlr_learn_scale": True, "mlr_max_scale": 4.0}
    assert references.reference_method(method).params == HBCT({**base, "clip": 1.4}).params
    assert references.parent_method(method).params == HBCT({**base, "clip": 1.2}).params


@pytest.mark.parametrize(("own", "parents"), [(1.5, 3.0), (2.0, 3.0), (3.0, 3.0), (4.0, 4.0)])
def test_the_parent_learns_its_scale_under_the_parent_free_ceiling_never_below_its_child(own, parents):
    """The default update (ceiling 1.5) trains its old generation with ceiling 3 (issue 14's recipe:
    ζ_o = 1.0, t ≤ 3 for the old model; ζ_n = 1.2, t ≤ 1.5 for φ_* and the new model)."""
    assert references.parent_method(HBCT({"mlr_max_scale": own})).params.mlr_max_scale == parents
    assert references.reference_method(HBCT({"mlr_max_scale": own})).params.mlr_max_scale == own
    default = HBCT()
    assert (default.params.mlr_learn_scale, default.params.mlr_max_scale, default.params.clip) == (True, 1.5, 1.2)
    assert (references.parent_method(default).params.mlr_max_scale, references.parent_method(default).params.clip) == (3.0, 1.0)


# --- parent checks --------------------------------------------------------------------------


def test_parent_with_other_curvature_raises():
    new_method = HBCT({"curv": 1.0})
    old_model = make_model(HBCT({"curv": 0.5, "clip": 1.0}))
    new_model = make_model(new_method)
    with pytest.raises(ValueError, match=r"parent curv=0\.5.*new curv=1\.0"):
        new_method.on_train_start(make_ctx(new_model, freeze(old_model)))


def test_parent_in_another_space_raises():
    new_method = HBCT()
    encoder = VectorEncoder(8, 6, build_lift("cosine"))
    old_model = CompatibleModel(encoder, nn.Linear(6, 3), seen_classes=range(3))
    with pytest.raises(ValueError, match="lorentz.*got cosine"):
        new_method.on_train_start(make_ctx(make_model(new_method), old_model))


def test_parent_with_other_clip_is_accepted():
    new_method = HBCT({"clip": 1.4})
    old_model = make_model(HBCT({"clip": 1.0}))
    new_method.on_train_start(make_ctx(make_model(new_method), freeze(old_model)))
