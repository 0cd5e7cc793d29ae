"""Encoder: shapes on 32x32 inputs, small-input stems, freezing, config validation."""
from __future__ import annotations

import math

import pydantic
import pytest
import torch
from torch import nn

from orchestrator.geometry.spaces import Space
from orchestrator.models.encoder import Encoder, EncoderConfig
from orchestrator.models.lifts import CosineLift, EuclideanLift, LorentzLift, PoincareLift
from orchestrator.models.outputs import ModelOutput


def _images(n: int = 4, chans: int = 3) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(n, chans, 32, 32)


@pytest.mark.parametrize(
    "lift, embedding_dim",
    [(EuclideanLift(), 16), (CosineLift(), 16), (LorentzLift(clip=1.0), 17), (PoincareLift(curv=0.1), 16)],
)
def test_tiny_encoder_forward_shapes_per_space(lift, embedding_dim):
    encoder = Encoder(EncoderConfig(arch="test_resnet", embed_dim=16, small_input=True), lift)
    out = encoder(_images())
    assert isinstance(out, ModelOutput) and out.logits is None
    assert out.features.shape == (4, 16) and out.embedding.shape == (4, embedding_dim)
    assert encoder.space is lift.space and encoder.embed_dim == 16
    if encoder.space is Space.LORENTZ:
        assert torch.all(out.features.norm(dim=1) <= 1.0 + 1e-6)


def test_small_input_keeps_resolution_in_deep_stem_and_resnet18():
    tiny = Encoder(EncoderConfig(arch="test_resnet", embed_dim=8, small_input=True), EuclideanLift())
    assert tiny.backbone.conv1[0].stride == (1, 1) and isinstance(tiny.backbone.maxpool, nn.Identity)
    # stem output stays 32x32 instead of 8x8
    assert tiny.backbone.conv1(_images(1)).shape[-1] == 32

    resnet = Encoder(EncoderConfig(arch="resnet18", embed_dim=128, small_input=True), LorentzLift())
    conv1 = resnet.backbone.conv1
    assert conv1.kernel_size == (3, 3) and conv1.stride == (1, 1) and conv1.padding == (1, 1)
    assert isinstance(resnet.backbone.maxpool, nn.Identity)
    resnet.eval()
    with torch.no_grad():
        out = resnet(_images(2))
    assert out.features.shape == (2, 128) and out.embedding.shape == (2, 129)
    minkowski = (out.embedding[:, 1:] ** 2).sum(1) - out.embedding[:, 0] ** 2
    torch.testing.assert_close(minkowski, torch.full((2,), -1.0), rtol=1e-4, atol=1e-4)


def test_other_families_and_channels():
    out = Encoder(EncoderConfig(arch="test_byobnet", embed_dim=10), CosineLift())(_images())
    assert out.embedding.shape == (4, 10)
    gray = Encoder(EncoderConfig(arch="test_resnet", embed_dim=10, in_chans=1, small_input=True), EuclideanLift())
    assert gray(_images(chans=1)).embedding.shape == (4, 10)
    with pytest.raises(ValueError, match="small_input.*test_convnext"):
        Encoder(EncoderConfig(arch="test_convnext", small_input=True), EuclideanLift())


def test_config_validation():
    with pytest.raises(pydantic.ValidationError):
        EncoderConfig(embed_dim=0)
    with pytest.raises(pydantic.ValidationError):
        EncoderConfig(archh="resnet18")
    with pytest.raises(ValueError, match="not_a_model"):
        Encoder(EncoderConfig(arch="not_a_model"), EuclideanLift())


def test_freeze_backbone_keeps_backbone_fixed_and_in_eval():
    encoder = Encoder(EncoderConfig(arch="test_resnet", embed_dim=8, small_input=True, freeze_backbone=True), EuclideanLift())
    assert not any(p.requires_grad for p in encoder.backbone.parameters())
    assert all(p.requires_grad for p in encoder.projection.parameters())
    encoder.train()
    assert encoder.training and encoder.projection.training
    assert not any(m.training for m in encoder.backbone.modules())
    before = {k: v.clone() for k, v in encoder.backbone.state_dict().items()}
    projection_before = encoder.projection.weight.detach().clone()
    optimizer = torch.optim.SGD([p for p in encoder.parameters() if p.requires_grad], lr=0.1)
    encoder(_images()).embedding.pow(2).sum().backward()
    optimizer.step()
    for key, value in encoder.backbone.state_dict().items():  # weights AND BatchNorm running stats
        assert torch.equal(value, before[key]), key
    assert not torch.equal(encoder.projection.weight, projection_before)


def test_unfrozen_backbone_trains():
    encoder = Encoder(EncoderConfig(arch="test_resnet", embed_dim=8, small_input=True), EuclideanLift())
    encoder.train()
    encoder(_images()).embedding.pow(2).sum().backward()
    grads = [p.grad for p in encoder.backbone.parameters()]
    assert all(g is not None for g in grads) and any(float(g.abs().sum()) > 0 for g in grads)
    assert math.isfinite(float(sum(g.abs().sum() for g in grads)))
