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
    report = weights.load_backbone_weights(target, path)
    _assert_same_weights(target, reference)
    assert report.unexpected == ["fc.weight"] and report.missing == [] and report.mismatched == []


def test_imagenet_stem_checkpoint_into_small_input_skips_only_conv1(tmp_path):
    imagenet_stem = _reference_backbone("resnet18", small_input=False)
    path = tmp_path / "resnet18.safetensors"
    safetensors.torch.save_file({k: v.contiguous() for k, v in imagenet_stem.state_dict().items()}, str(path))
    small = Encoder(EncoderConfig(arch="resnet18", embed_dim=8, small_input=True), EuclideanLift()).backbone
    report = weights.load_backbone_weights(small, path)
    assert report.mismatched == ["conv1.weight"] and report.missing == ["conv1.weight"]
    _assert_same_weights(small, imagenet_stem, skip=("conv1.weight",))


def test_checkpoint_with_no_matching_key_raises(tmp_path):
    path = tmp_path / "other.safetensors"
    safetensors.torch.save_file({"something.else": torch.zeros(3)}, str(path))
    with pytest.raises(ValueError, match="no key"):
        weights.load_backbone_weights(_reference_backbone(), path)


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
