"""Generation checkpoints and training state on the local file system."""
import copy
import json
import os
from datetime import datetime, timezone

import pytest
import torch

from orchestrator.methods.loading import load_generation
from orchestrator.methods.registry import create_method
from orchestrator.models import checkpoint as ckpt
from orchestrator.models.checkpoint import CARD_FORMAT_VERSION, checkpoint_exists, load_card, save_generation
from orchestrator.storage import ChecksumMismatch, sha256_hex
from orchestrator.training.state import load_training_state, save_training_state
from storage_cases import ENCODER, assert_same_outputs, assert_same_state, build_case


def test_round_trip_is_bit_identical(case, tmp_path):
    method, model, adapters = case
    uri = str(tmp_path / "gen1")
    card = save_generation(model, method, ENCODER, uri, name="gen1", parent="gen0")
    assert sorted(os.listdir(uri)) == ["card.json", "model.safetensors"]
    loaded, loaded_card = load_generation(uri, expected_sha256=card.sha256)
    assert loaded_card == card
    assert not loaded.training
    assert_same_state(model, loaded)
    assert_same_outputs(model, loaded, adapters)


def test_card_fields(case, tmp_path):
    method, model, adapters = case
    uri = f"file://{tmp_path}/g"
    before = datetime.now(timezone.utc)
    card = save_generation(model, method, ENCODER, uri, name="g", extra={"note": "x", "acc": 0.5})
    raw = json.loads((tmp_path / "g" / "card.json").read_text())
    assert raw["format_version"] == CARD_FORMAT_VERSION
    assert raw["name"] == "g" and raw["parent"] is None
    assert raw["method"] == json.loads(json.dumps(method.describe()))
    assert raw["encoder"] == ENCODER.model_dump()
    # the head's label space: 4 here, except d-Simplex whose head has all K = embed_dim + 1 prototypes
    assert raw["num_classes"] == model.num_classes == (ENCODER.embed_dim + 1 if method.name == "dsimplex" else 4)
    assert raw["seen_classes"] == [0, 1]
    assert raw["space"] == method.space.value == model.space.value
    assert raw["curv"] == model.curv
    assert raw["sha256"] == sha256_hex((tmp_path / "g" / "model.safetensors").read_bytes())
    assert raw["extra"] == {"note": "x", "acc": 0.5}
    created = datetime.fromisoformat(raw["created_at"].replace("Z", "+00:00"))
    assert created.utcoffset().total_seconds() == 0 and created >= before.replace(microsecond=0)
    assert load_card(uri) == card and checkpoint_exists(uri)
    assert raw["adapters"] == expected_adapter_specs(adapters)


def expected_adapter_specs(adapters):
    """The card's adapter specs for a case: each adapter an ``embedding_map`` around its kind."""
    if adapters is None:
        return {}
    n, d = ENCODER.embed_dim, adapters["old_dim"]

    def wrapped(inner):
        return {"kind": "embedding_map", "normalize_input": adapters["normalize"], "map": inner}

    if "form" in adapters:
        inner = ({"kind": "mlp", "in_dim": d, "out_dim": n, "hidden_dim": adapters["hidden_dim"]}
                 if adapters["form"] == "mlp" else {"kind": "affine", "in_dim": d, "out_dim": n, "bias": True})
        return {"forward_map": wrapped(inner)}
    backward = ({"kind": "orthogonal", "dim": n} if adapters["variant"] == "orthogonal"
                else {"kind": "affine", "in_dim": n, "out_dim": n, "bias": True})
    return {"backward": wrapped(backward),
            "forward_map": wrapped({"kind": "affine", "in_dim": d, "out_dim": n, "bias": True})}


def format_1_adapter_specs(adapters):
    """The adapter specs a format-1 card held (named after the building method), as that code wrote them."""
    if adapters is None:
        return {}
    if "form" in adapters:
        return {"forward_map": {
            "builder": "fct", "role": "forward", "old_dim": adapters["old_dim"], "new_dim": ENCODER.embed_dim,
            "form": adapters["form"], "hidden_dim": adapters["hidden_dim"], "normalize_inputs": adapters["normalize"]}}
    common = {"builder": "lambda_orth", "old_dim": adapters["old_dim"], "new_dim": ENCODER.embed_dim,
              "variant": adapters["variant"], "normalize_inputs": adapters["normalize"]}
    return {"backward": {**common, "role": "backward"}, "forward_map": {**common, "role": "forward"}}


def test_a_format_1_card_still_loads(case, tmp_path):
    method, model, adapters = case
    uri = str(tmp_path / "old")
    save_generation(model, method, ENCODER, uri, name="old")
    raw = json.loads((tmp_path / "old" / "card.json").read_text())
    raw["format_version"], raw["adapters"] = 1, format_1_adapter_specs(adapters)
    (tmp_path / "old" / "card.json").write_text(json.dumps(raw))
    loaded, card = load_generation(uri)
    assert card.format_version == 1
    assert_same_state(model, loaded)
    assert_same_outputs(model, loaded, adapters)
    raw["adapters"] = {"backward": {"builder": "nosuch", "role": "backward", "new_dim": 8, "normalize_inputs": True}}
    (tmp_path / "old" / "card.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="unknown format-1 adapter spec"):
        load_generation(uri)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    method, model = build_case("independent", {"space": "cosine"}, None)
    uri = str(tmp_path_factory.mktemp("ckpt") / "gen0")
    card = save_generation(model, method, None, uri, name="gen0")
    return uri, card


def _flip_one_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_tampered_weights_raise_before_deserialising(tmp_path, monkeypatch):
    method, model = build_case("independent", {"space": "cosine"}, None)
    uri = str(tmp_path / "gen0")
    card = save_generation(model, method, ENCODER, uri, name="gen0")
    _flip_one_byte(tmp_path / "gen0" / "model.safetensors")

    def must_not_deserialise(data):
        raise AssertionError("deserialised unverified bytes")

    monkeypatch.setattr(ckpt.safetensors.torch, "load", must_not_deserialise)
    with pytest.raises(ChecksumMismatch) as info:
        load_generation(uri)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "gen0/model.safetensors" in message and card.sha256 in message and info.value.actual in message
    assert info.value.actual != card.sha256


def test_expected_sha256_mismatch(saved):
    uri, card = saved
    with pytest.raises(ChecksumMismatch, match="0" * 64):
        load_generation(uri, expected_sha256="0" * 64)


def test_missing_card_or_weights(tmp_path, saved):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_generation(str(tmp_path / "nowhere"))
    uri, _ = saved
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "card.json").write_bytes(open(os.path.join(uri, "card.json"), "rb").read())
    with pytest.raises(FileNotFoundError, match="copy"):
        load_generation(str(copy))
    assert not checkpoint_exists(str(tmp_path / "nowhere"))


def test_newer_card_format_is_refused(tmp_path, saved):
    uri, _ = saved
    raw = json.loads(open(os.path.join(uri, "card.json")).read())
    raw["format_version"] = CARD_FORMAT_VERSION + 1
    (tmp_path / "card.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="format_version"):
        load_card(str(tmp_path))


def test_save_rejects_mismatched_method_or_encoder_and_bad_extra(tmp_path):
    method, model = build_case("hbct", {}, None)
    with pytest.raises(ValueError, match="space"):
        save_generation(model, create_method("independent", {"space": "cosine"}), ENCODER, str(tmp_path / "a"), name="a")
    with pytest.raises(ValueError, match="encoder_config"):
        save_generation(model, method, ENCODER.model_copy(update={"embed_dim": 16}), str(tmp_path / "b"), name="b")
    with pytest.raises((TypeError, ValueError)):
        save_generation(model, method, ENCODER, str(tmp_path / "c"), name="c", extra={"x": object()})
    assert not any((tmp_path / d).exists() and os.listdir(tmp_path / d) for d in "abc")


def test_resave_replaces_weights_and_card(tmp_path):
    uri = str(tmp_path / "g")
    method, model_a = build_case("independent", {"space": "cosine"}, None, seed=0)
    _, model_b = build_case("independent", {"space": "cosine"}, None, seed=1)
    save_generation(model_a, method, ENCODER, uri, name="g")
    card_b = save_generation(model_b, method, ENCODER, uri, name="g")
    loaded, card = load_generation(uri)
    assert card == card_b
    assert_same_state(model_b, loaded)
    assert sorted(os.listdir(uri)) == ["card.json", "model.safetensors"]


def test_float64_adapters_load_exactly(tmp_path):
    method, model = build_case("lambda_orth", {}, dict(old_dim=6, variant="orthogonal", normalize=True))
    model.adapters.double()
    uri = str(tmp_path / "g")
    save_generation(model, method, ENCODER, uri, name="g")
    loaded, _ = load_generation(uri)
    assert_same_state(model, loaded)


def test_unknown_adapter_cannot_be_saved(tmp_path):
    method, model = build_case("independent", {"space": "cosine"}, None)
    model.adapters["custom"] = torch.nn.Linear(8, 8)
    with pytest.raises(ValueError, match="custom"):
        save_generation(model, method, ENCODER, str(tmp_path / "g"), name="g")


# --- training state -------------------------------------------------------------------------------
def _trained_optimizer(kind):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    if kind == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.8, 0.99), amsgrad=True)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(8, 5)).pow(2).mean().backward()
        optimizer.step()
    return model, optimizer


def _assert_same_structure(a, b):
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _assert_same_structure(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same_structure(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_training_state_round_trip_restores_optimizer_exactly(kind, tmp_path):
    model, optimizer = _trained_optimizer(kind)
    rng = torch.get_rng_state()
    extra = {"rng": rng, "scheduler": {"last_epoch": 3, "_last_lr": [0.1]}, "best": float("inf"), 7: "int key"}
    uri = str(tmp_path / "train")
    save_training_state(uri, optimizer.state_dict(), epoch=3, extra=extra)
    assert sorted(os.listdir(uri)) == ["training_state.json", "training_state.safetensors"]
    restored = load_training_state(uri)
    assert restored.epoch == 3
    _assert_same_structure(optimizer.state_dict(), restored.optimizer_state)
    _assert_same_structure(extra, restored.extra)

    # a fresh optimizer over a copy of the parameters continues exactly like the original
    clone = copy.deepcopy(model)
    fresh = type(optimizer)(clone.parameters(), lr=0.5)
    fresh.load_state_dict(restored.optimizer_state)
    _assert_same_structure(optimizer.state_dict(), fresh.state_dict())
    batch = torch.randn(8, 5)
    for net, opt in ((model, optimizer), (clone, fresh)):
        opt.zero_grad()
        net(batch).pow(2).mean().backward()
        opt.step()
    for p, q in zip(model.parameters(), clone.parameters()):
        assert torch.equal(p, q)


def test_training_state_tamper_and_missing(tmp_path):
    _, optimizer = _trained_optimizer("sgd")
    uri = str(tmp_path / "train")
    save_training_state(uri, optimizer.state_dict(), epoch=1)
    _flip_one_byte(tmp_path / "train" / "training_state.safetensors")
    with pytest.raises(ChecksumMismatch):
        load_training_state(uri)
    with pytest.raises(FileNotFoundError, match="elsewhere"):
        load_training_state(str(tmp_path / "elsewhere"))
    with pytest.raises(TypeError, match="extra"):
        save_training_state(str(tmp_path / "t2"), optimizer.state_dict(), epoch=1, extra={"bad": {1, 2}})


def test_checksum_mismatch_survives_pickling():
    import pickle

    from orchestrator.storage import ChecksumMismatch

    error = pickle.loads(pickle.dumps(ChecksumMismatch("/x/g0", "a" * 64, "b" * 64)))
    assert (error.uri, error.expected, error.actual) == ("/x/g0", "a" * 64, "b" * 64)
    assert "expected sha256 " + "a" * 64 in str(error)
