"""Pretrained weights: local safetensors / torch checkpoints, safety, and the offline hub error."""
from __future__ import annotations

import logging
import pickle

import pytest
import safetensors.torch
import timm
import torch

import orchestrator.models.weights as weights
from orchestrator.models.encoder import Encoder, EncoderConfig
from orchestrator.models.lifts import EuclideanLift


def _reference_backbone(arch: str = "test_resnet", small_input: bool = True) -> torch.nn.Module:
    torch.manual_seed(123)
    return Encoder(EncoderConfig(arch=arch, embed_dim=8, small_input=small_input), EuclideanLift()).backbone


def _load_into_backbone(backbone: torch.nn.Module, path) -> weights.LoadReport:
    return weights.load_encoder_weights(backbone, torch.nn.Linear(backbone.num_features, 8), path)


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, skip: tuple[str, ...] = ()) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        if key not in skip:
            assert torch.equal(sa[key], sb[key]), key


def test_pretrained_from_local_safetensors(tmp_path, caplog):
    reference = _reference_backbone()
    path = tmp_path / "backbone.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(path))
    torch.manual_seed(999)  # a different random init, overwritten by the load
    with caplog.at_level(logging.INFO, logger=weights.__name__):
        encoder = Encoder(EncoderConfig(arch="test_resnet", embed_dim=8, small_input=True, pretrained=str(path)), EuclideanLift())
    _assert_same_weights(encoder.backbone, reference)
    assert "0 missing, 0 unexpected" in caplog.text


def test_pretrained_from_nested_torch_checkpoint(tmp_path):
    reference = _reference_backbone()
    state = {"module." + k: v for k, v in reference.state_dict().items()}
    state["module.fc.weight"] = torch.zeros(5, 3)  # classifier of the source model: unexpected here
    path = tmp_path / "checkpoint.pth"
    torch.save({"epoch": 3, "state_dict": state}, path)
    target = _reference_backbone()
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    report = _load_into_backbone(target, path)
    _assert_same_weights(target, reference)
    assert report.unexpected == ["fc.weight"] and report.missing == [] and report.mismatched == []


def test_imagenet_stem_checkpoint_into_small_input_skips_only_conv1(tmp_path):
    imagenet_stem = _reference_backbone("resnet18", small_input=False)
    path = tmp_path / "resnet18.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in imagenet_stem.state_dict().items()}, str(path))
    small = Encoder(EncoderConfig(arch="resnet18", embed_dim=8, small_input=True), EuclideanLift()).backbone
    report = _load_into_backbone(small, path)
    assert report.mismatched == ["conv1.weight"] and report.missing == ["conv1.weight"]
    _assert_same_weights(small, imagenet_stem, skip=("conv1.weight",))


def test_checkpoint_with_no_matching_key_raises(tmp_path):
    path = tmp_path / "other.safetensors"
    safetensors.torch.save_file({"something.else": torch.zeros(3)}, str(path))
    with pytest.raises(ValueError, match="no key"):
        _load_into_backbone(_reference_backbone(), path)


class _NotWeights:
    def __reduce__(self):
        return (print, ("arbitrary code ran",))


def test_torch_checkpoint_with_arbitrary_objects_is_refused(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": _NotWeights()}, path)
    with pytest.raises(pickle.UnpicklingError):
        weights.read_state_dict(path)


def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError):
        weights.read_state_dict(tmp_path / "missing.safetensors")
    text = tmp_path / "weights.txt"
    text.write_text("x")
    with pytest.raises(ValueError, match="pretrained"):
        weights.read_state_dict(text)


def test_hub_offline_gives_clear_error(monkeypatch):
    """timm downloads through ``timm.models._hub.hf_hub_download`` (or torch.hub for URL weights)."""

    def offline(*args, **kwargs):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(timm.models._hub, "hf_hub_download", offline)
    monkeypatch.setattr(timm.models._builder, "load_state_dict_from_url", offline)
    with pytest.raises(RuntimeError, match=r"'test_resnet'.*offline.*local path in pretrained"):
        Encoder(EncoderConfig(arch="test_resnet", embed_dim=8, pretrained="hub"), EuclideanLift())


def _dsimplex_code_layout(backbone_state: dict, fc1: torch.Tensor) -> dict:
    """A checkpoint as the d-Simplex code writes one (stationary_dsimplex.md §4.2, its
    ``Incremental_ResNet``): ``{"net": ...}`` with the backbone under ``backbone.``, a stage's blocks
    as ``layer1.blocks.0.*``, the projection ``fc1`` without bias and the fixed classifier ``fc2``."""
    net = {}
    for key, value in backbone_state.items():
        parts = key.split(".")
        if parts[0].startswith("layer"):
            parts.insert(1, "blocks")
        net["backbone." + ".".join(parts)] = value
    net["fc1.weight"] = fc1
    net["fc2.weight"] = torch.randn(12, fc1.shape[0])
    return {"net": net}


def test_dsimplex_code_checkpoint_loads_backbone_and_projection(tmp_path):
    torch.manual_seed(5)
    source = timm.create_model("resnet18", pretrained=False, num_classes=0).eval()
    fc1 = torch.randn(11, source.num_features)
    path = tmp_path / "ckpt_0.pt"
    torch.save(_dsimplex_code_layout(source.state_dict(), fc1), path)
    torch.manual_seed(6)  # another random init: every loaded tensor must come from the file
    encoder = Encoder(EncoderConfig(arch="resnet18", embed_dim=11, small_input=False, pretrained=str(path)),
                      EuclideanLift()).eval()
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected = source(images) @ fc1.T  # the code's z = fc1(backbone(x)), fc1 without bias
        got = encoder(images).features
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    report = weights.load_encoder_weights(encoder.backbone, encoder.projection, path)
    assert report.projection_loaded and report.missing == [] and report.unexpected == ["fc2.weight"]


def test_generation_file_of_this_project_loads_as_pretrained(tmp_path):
    """A replacement may start from a model this project trained elsewhere: its generation file
    (``encoder.backbone.*``, ``encoder.projection.*`` beside its head) gives the same embedding."""
    from orchestrator.methods import create_method
    from orchestrator.models.checkpoint import save_generation
    from orchestrator.models.checkpoint_layout import WEIGHTS_FILE

    method = create_method("dsimplex", {"num_prototypes": 16})
    torch.manual_seed(7)
    trained = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=15), 4, torch.arange(4)).eval()
    save_generation(trained, method, None, str(tmp_path / "g"), "g")
    path = tmp_path / "g" / WEIGHTS_FILE
    torch.manual_seed(8)
    replacement = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=15, pretrained=str(path)), 4,
                                     torch.arange(4)).eval()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(replacement(images).embedding, trained(images).embedding)


def test_projection_of_another_size_is_skipped_and_reported(tmp_path):
    torch.manual_seed(9)
    source = Encoder(EncoderConfig(arch="test_resnet", embed_dim=6), EuclideanLift())
    path = tmp_path / "encoder.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    target = Encoder(EncoderConfig(arch="test_resnet", embed_dim=8), EuclideanLift())
    before = target.projection.weight.detach().clone()
    report = weights.load_encoder_weights(target.backbone, target.projection, path)
    _assert_same_weights(target.backbone, source.backbone)
    assert not report.projection_loaded and report.mismatched == ["projection.weight"]
    assert torch.equal(target.projection.weight, before)


def test_split_encoder_state_keeps_a_bare_backbone_whole():
    state = {"conv1.weight": torch.zeros(1), "layer1.0.bn1.bias": torch.zeros(1), "fc.weight": torch.zeros(1)}
    backbone, projection = weights.split_encoder_state(state)
    assert backbone.keys() == state.keys() and projection == {}
