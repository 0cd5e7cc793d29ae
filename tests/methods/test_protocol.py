"""The shared method protocol (methods/base.py, registry.py): every registered method is created,
built, trained against a frozen parent and described the same way."""
from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from pydantic import ValidationError

from image_data import LabelShiftedImages
from orchestrator.comparison import IncomparableGenerations, comparison_path
from orchestrator.geometry.spaces import Space
from orchestrator.methods import references, registry
from orchestrator.methods.base import CompatibilityMethod
from orchestrator.methods.bct import BCT
from orchestrator.methods.dsimplex import DSimplex
from orchestrator.methods.hbct import HBCT
from orchestrator.methods.independent import Independent
from orchestrator.methods.registry import available_methods, create_method, method_class, register_method
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.config import TrainConfig
from orchestrator.training.loop import train_generation

FIRST_TIER = {
    "independent", "l2", "bct", "hot_refresh", "hoc", "hbct", "ndpp", "odpp", "dsimplex", "lambda_orth",
    "binary_hyperbolic",
}
SECOND_TIER = {"lce", "unibct", "advbct", "fct"}
METHODS = FIRST_TIER | SECOND_TIER  # they train their encoder
POSTHOC = {"procrustes", "low_rank_affine", "residual_mlp", "slerp"}  # a given encoder, a fitted map (tests/methods/test_posthoc.py)
NUM_CLASSES = 4
EMBED_DIM = 8  # dsimplex: K = embed_dim + 1 = 9 >= 4 classes; binary_hyperbolic: 8 >= 4 - 1

# Methods with a parent-free base objective that still align to a parent when given one.
ALIGNS_OPTIONALLY = {"hbct", "dsimplex", "binary_hyperbolic"}
# Non-default parameters: binary_hyperbolic's alignment term is off by default (lam = 0).
PARAMS = {"binary_hyperbolic": {"lam": 0.1}}
# The named loss terms each method logs when trained against a parent (independent: no parent).
TERMS = {
    "independent": {"base"},
    "l2": {"base", "l2"},
    "bct": {"base", "influence"},
    "hot_refresh": {"base", "contrastive"},
    "hoc": {"base", "infonce"},
    "hbct": {"base", "entailment", "contrastive"},
    "ndpp": {"base", "compatibility"},
    "odpp": {"base", "compatibility"},
    "dsimplex": {"base", "infonce"},
    "lambda_orth": {"base"},
    "binary_hyperbolic": {"base", "alignment"},
    "lce": {"base", "arcface", "boundary"},
    "unibct": {"base", "arcface"},
    "advbct": {"base", "boundary", "adversarial"},
    "fct": {"base"},
}


def _images(seed: int = 0, n: int = 32) -> LabelShiftedImages:
    """n random 16x16 images of 4 classes (shifted by the label so classes are separable)."""
    return LabelShiftedImages(n=n, num_classes=NUM_CLASSES, seed=seed)


def _encoder(embed_dim: int = EMBED_DIM) -> EncoderConfig:
    return EncoderConfig(arch="test_resnet", embed_dim=embed_dim, small_input=False)


def _build(method: CompatibilityMethod, seed: int, embed_dim: int = EMBED_DIM):
    torch.manual_seed(seed)
    return method.build_model(_encoder(embed_dim), NUM_CLASSES, seen_classes=torch.arange(NUM_CLASSES))


# --- registry ---------------------------------------------------------------------------------
def test_available_methods_are_exactly_the_implemented_ones():
    methods = available_methods()
    assert set(methods) == METHODS | POSTHOC
    assert list(methods) == sorted(METHODS | POSTHOC)
    for name, description in methods.items():
        cls = method_class(name)
        assert description.name == name and issubclass(cls, CompatibilityMethod)
        assert issubclass(cls, description) and cls.Params is description.Params  # the traits are the description's
        assert description.trains_encoder is (name in METHODS)


@pytest.mark.parametrize("name", sorted(METHODS | POSTHOC))
def test_create_method_defaults_equal_params_defaults(name):
    method = create_method(name)
    cls = method_class(name)
    assert type(method) is cls
    assert type(method.params) is cls.Params
    assert method.params == cls.Params()
    assert method.params.model_dump() == cls.Params().model_dump()
    # an explicit empty mapping and None mean the same
    assert create_method(name, {}).params == cls.Params()


def test_unknown_method_lists_the_known_names():
    with pytest.raises(ValueError, match="unknown method 'no_such_method'") as info:
        create_method("no_such_method")
    message = str(info.value)
    for name in METHODS | POSTHOC:
        assert name in message


def test_unknown_parameter_is_a_validation_error_naming_it():
    with pytest.raises(ValidationError) as info:
        create_method("l2", {"lamm": 0.5})
    assert "lamm" in str(info.value)
    assert info.value.errors()[0]["loc"] == ("lamm",)
    # a valid field still validates its value
    with pytest.raises(ValidationError) as info:
        create_method("hoc", {"lam": 1.5})
    assert info.value.errors()[0]["loc"] == ("lam",)
    assert create_method("l2", {"lam": 0.25}).params.lam == 0.25


def test_params_of_the_wrong_class_are_rejected():
    with pytest.raises(TypeError, match="L2Params"):
        method_class("l2")(Independent.Params())


def test_registering_a_second_class_under_an_existing_name_fails():
    before = dict(registry._METHODS)

    class Impostor(Independent):
        name = "bct"

    with pytest.raises(ValueError, match="'bct' is already registered"):
        register_method(Impostor)
    assert registry._METHODS == before
    assert method_class("bct") is BCT
    # re-registering the same class is a no-op
    assert register_method(BCT) is BCT
    assert registry._METHODS == before

    class Nameless(Independent):
        name = ""

    with pytest.raises(ValueError, match="must set a string class attribute 'name'"):
        register_method(Nameless)
    assert registry._METHODS == before


# --- every method through the same protocol ---------------------------------------------------
@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_protocol_end_to_end(name):
    method = create_method(name, PARAMS.get(name))
    data = _images()
    config = TrainConfig(epochs=2, batch_size=8, lr=0.05, augment=False)

    wants_parent = method.requires_parent or name in ALIGNS_OPTIONALLY
    parent = None
    if wants_parent:
        parent_method = references.parent_method(method)
        parent = _build(parent_method, seed=1)
        parent_history = train_generation(parent_method, parent, data, data, config.model_copy(update={"epochs": 1}))
        assert len(parent_history) == 1 and math.isfinite(parent_history[0]["loss"])
        # the parent lives where this method's embeddings live (cross-model retrieval is possible)
        assert parent.space is method.space
    parent_state = copy.deepcopy(parent.state_dict()) if parent is not None else None

    model = _build(method, seed=2)
    assert model.space is method.space
    if name in ("lambda_orth", "fct"):
        assert len(model.adapters) == 0
    initial = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    assert initial, "the model has no trainable parameter"

    history = train_generation(method, model, data, data, config, old_model=parent)

    # one stats dict per epoch, every logged term finite, the total their sum
    assert len(history) == 2
    for epoch, stats in enumerate(history):
        assert stats["epoch"] == epoch and stats["samples"] == len(data)
        terms = {k[len("loss/"):]: v for k, v in stats.items() if k.startswith("loss/")}
        assert set(terms) == TERMS[name]
        assert all(math.isfinite(v) for v in terms.values()), stats
        assert math.isfinite(stats["loss"])
        assert stats["loss"] == pytest.approx(sum(terms.values()), rel=1e-6, abs=1e-7)

    # the parent is frozen: bit-identical weights and buffers (BatchNorm statistics included)
    if parent is not None:
        after = parent.state_dict()
        assert set(after) == set(parent_state)
        for key, value in parent_state.items():
            assert torch.equal(after[key], value), f"parent {key} changed"
        assert not any(p.requires_grad for p in parent.parameters())

    # the new model learned: its projection moved, and so did every trainable parameter
    changed = {k for k, v in model.named_parameters() if k in initial and not torch.equal(v.detach(), initial[k])}
    assert "encoder.projection.weight" in changed
    assert changed == set(initial), f"unchanged: {sorted(set(initial) - changed)}"

    if name == "lambda_orth":
        assert set(model.adapters) == {"backward", "forward_map"}
        with torch.no_grad():
            b = model.adapters["backward"].map.matrix
            torch.testing.assert_close(b @ b.T, torch.eye(EMBED_DIM), atol=1e-5, rtol=0)  # B_⊥ is a rotation
            mapped = model.adapters["forward_map"](torch.randn(5, EMBED_DIM))
        assert mapped.shape == (5, EMBED_DIM) and torch.isfinite(mapped).all()
    if name == "fct":
        assert set(model.adapters) == {"forward_map"}  # F alone: no backward map
        with torch.no_grad():
            mapped = model.adapters["forward_map"](torch.randn(5, EMBED_DIM))
        assert mapped.shape == (5, EMBED_DIM) and torch.isfinite(mapped).all()

    description = method.describe()
    restored = json.loads(json.dumps(description))
    assert restored == description
    assert restored["name"] == name
    assert restored["space"] == method.space.value == model.space.value
    assert restored["params"] == method.params.model_dump()
    # the description rebuilds the same method
    assert create_method(restored["name"], restored["params"]).params == method.params


@pytest.mark.parametrize("name", sorted(n for n, c in available_methods().items() if c.requires_parent))
def test_parent_required_methods_refuse_to_train_without_one(name):
    method = create_method(name)
    model = _build(method, seed=0)
    before = copy.deepcopy(model.state_dict())
    config = TrainConfig(epochs=1, batch_size=8)
    with pytest.raises(ValueError, match=f"method '{name}' aligns to a parent generation, but no parent was given"):
        train_generation(method, model, _images(), _images(), config)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())


def test_parent_free_methods_are_exactly_the_expected_ones():
    parent_free = {n for n, c in available_methods().items() if not c.requires_parent}
    assert parent_free == ALIGNS_OPTIONALLY | {"independent"}


# --- the parent's embedding size ----------------------------------------------------------------
@pytest.mark.parametrize(("parent_dim", "child_dim"), [(16, 24), (24, 16)])
@pytest.mark.parametrize("name", sorted(available_methods()))
def test_requires_parent_embed_dim_is_what_training_against_a_parent_of_another_size_does(name, parent_dim, child_dim):
    """The declaration the pipeline file's validation reads (``requires_parent_embed_dim``,
    config/pipeline.py) against the code: trained against a parent of another embed_dim (one
    loss step, hooks included), a method that declares False trains and one that declares True
    raises, while it trains against a parent of its own size. Default parameters (e.g.
    binary_hyperbolic without its alignment term: the shared prototypes need the size too)."""
    data = _images(n=8)
    config = TrainConfig(epochs=1, batch_size=8, lr=0.05, augment=False)

    def train(parent_embed_dim: int) -> list[dict[str, float]]:
        method = create_method(name)
        parent = _build(references.parent_method(method), seed=1, embed_dim=parent_embed_dim)
        model = _build(method, seed=2, embed_dim=child_dim)
        return train_generation(method, model, data, data, config, old_model=parent)

    if not method_class(name).trains_encoder:  # no training step: the map bridges the sizes
        assert not method_class(name).requires_parent_embed_dim and train(parent_dim) == []
        return
    if not method_class(name).requires_parent_embed_dim:
        history = train(parent_dim)
        assert len(history) == 1 and math.isfinite(history[0]["loss"])
        return
    assert math.isfinite(train(child_dim)[0]["loss"])  # the size is the only difference
    with pytest.raises((ValueError, RuntimeError)):
        train(parent_dim)


@pytest.mark.parametrize("name", sorted(n for n, c in available_methods().items()
                                        if not c.requires_parent_embed_dim and n != "independent"))
def test_requires_embed_dim_at_least_parents_is_whether_a_narrower_child_can_search_its_parent(name):
    """The second declaration validation reads, against serving: a child of 16 coordinates,
    trained against a parent of 24 (hooks included, so the adapters are fitted), maps its queries
    for the parent's full-width index, or is refused there exactly when the method declares it.
    (independent is never searched across generations, whatever the sizes.)"""
    data = _images(n=8)
    method = create_method(name)
    parent = _build(references.parent_method(method), seed=1, embed_dim=24)
    child = _build(method, seed=2, embed_dim=16)
    train_generation(method, child, data, data, TrainConfig(epochs=1, batch_size=8, lr=0.05, augment=False),
                     old_model=parent)
    path = comparison_path("child", "parent", {"child": child, "parent": parent}, {"child": "parent", "parent": None})
    queries = torch.randn(3, 16)
    if method_class(name).requires_embed_dim_at_least_parents:
        with pytest.raises(IncomparableGenerations, match="the gallery's index holds 24"):
            path.map_queries(queries, 24)
    elif not method_class(name).trains_encoder:  # a post-hoc map writes the parent's 24 coordinates
        parents_queries = {"parent": torch.randn(3, 24)} if path.query_generations else None  # slerp takes them too
        assert path.kind == "adapter" and path.map_queries(queries, 24, parents_queries).shape == (3, 24)
    else:  # fct: the parent's gallery is mapped by F into the child's 16 coordinates
        gallery = path.map_gallery(torch.randn(5, 24))
        assert gallery.shape == (5, 16) and path.map_queries(queries, gallery.shape[-1]).shape == (3, 16)


# --- reference and parent methods -------------------------------------------------------------
@pytest.mark.parametrize("space", ["cosine", "euclidean"])
def test_bct_reference_and_parent_are_independent_in_the_same_space(space):
    method = BCT({"space": space, "lam": 0.5})
    for other in (references.reference_method(method), references.parent_method(method)):
        assert type(other) is Independent
        assert other.space is method.space is Space(space)
        assert other.params == Independent.Params(space=space)


@pytest.mark.parametrize("name", sorted(n for n, c in available_methods().items() if c.requires_parent))
def test_every_parent_aligned_method_references_independent(name):
    method = create_method(name)
    reference = references.reference_method(method)
    assert type(reference) is Independent and reference.space is method.space
    assert type(references.parent_method(method)) is Independent


def test_l2_lorentz_reference_keeps_the_geometry():
    """The reference (and parent) of a Lorentz ℓ2 model must share its curvature, or the old and new
    generations have no common distance; the reference is the same model without the ℓ2 term."""
    method = create_method("l2", {"space": "lorentz", "curv": 2.0, "clip": 1.4, "lam": 0.5})
    for other in (references.reference_method(method), references.parent_method(method)):
        assert type(other) is Independent
        assert other.space is Space.LORENTZ
        assert other.params == Independent.Params(space="lorentz", curv=2.0, clip=1.4)
        model = _build(other, seed=0)
        assert model.curv == 2.0 and model.encoder.lift.clip == 1.4


def test_hbct_parent_lowers_the_clip_and_reference_is_itself_without_alignment_settings():
    method = HBCT({"lam": 0.5, "tau": 0.7, "mlr_init_scale": 3.0})
    parent = references.parent_method(method)
    assert type(parent) is HBCT
    assert parent.params.clip == pytest.approx(method.params.clip - 0.2) == pytest.approx(1.0)
    # the alignment fields at their defaults; the learned scale under the parent-free ceiling
    assert parent.params == HBCT({"clip": parent.params.clip, "mlr_init_scale": 3.0,
                                  "mlr_max_scale": HBCT.PARENT_FREE_MAX_SCALE}).params
    assert references.parent_method(HBCT({"clip": 1.6})).params.clip == pytest.approx(1.4)
    assert references.parent_method(HBCT({"clip": 0.3})).params.clip == pytest.approx(0.2)  # floored at 0.2

    reference = references.reference_method(method)
    assert type(reference) is HBCT and reference is not method
    assert reference.params == HBCT({"mlr_init_scale": 3.0}).params
    assert references.reference_method(HBCT()).params == HBCT().params


def test_dsimplex_reference_and_parent_are_itself_without_the_hoc_weights():
    """Trained with no parent, λ and τ do not act: the old model and φ_* take their defaults, so
    d-Simplex variants that differ only there share them (issue 28)."""
    method = DSimplex({"lam": 0.3, "tau": 5.0, "num_prototypes": 9})
    for other in (references.reference_method(method), references.parent_method(method)):
        assert type(other) is DSimplex and other is not method
        assert other.params == DSimplex({"num_prototypes": 9}).params
    # and they build the identical fixed classifier (stationarity)
    a = _build(method, seed=0).head.weight
    b = _build(references.parent_method(method), seed=1).head.weight
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(n for n, c in available_methods().items() if not c.requires_parent))
def test_parent_free_methods_reference_themselves(name):
    method = create_method(name)
    reference = references.reference_method(method)
    assert type(reference) is type(method) and reference.params == method.params


def test_binary_hyperbolic_reference_and_parent_leave_the_alignment_term_off():
    method = create_method("binary_hyperbolic", {"lam": 0.3, "curv": 0.2, "num_prototypes": 12})
    for other in (references.reference_method(method), references.parent_method(method)):
        assert other.params == create_method("binary_hyperbolic", {"curv": 0.2, "num_prototypes": 12}).params


@pytest.mark.parametrize("name, space", [("hbct", Space.LORENTZ), ("binary_hyperbolic", Space.POINCARE)])
def test_a_method_comparing_embeddings_in_one_space_refuses_a_parent_of_another_space_or_curvature(name, space):
    """HBCT and the binary hyperbolic codes compare the two generations' embeddings directly: the
    parent must live in the same space with the same curvature (``methods.common.check_parent_geometry``)."""
    method = create_method(name, {})
    assert method.space is space
    new_model = [_build(method, seed=2)] if name == "binary_hyperbolic" else []  # it checks the anchors too

    def check(parent_method) -> None:
        method.check_parent(_build(parent_method, seed=1), *new_model)

    with pytest.raises(ValueError, match=f"^{name}: the parent generation must live in the {space.value} space"):
        check(create_method("bct", {}))
    with pytest.raises(ValueError, match=rf"^{name}: the parent's curvature must equal this generation's: parent curv="):
        check(create_method(name, {"curv": 2.0 * method.params.curv}))
    check(create_method(name, {}))
