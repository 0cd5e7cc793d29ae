"""Encoder: timm backbone -> Linear projection to ``embed_dim`` -> space lift (HBCT §3 hybrid encoder)."""
from __future__ import annotations

from typing import Any

import timm
import torch
from torch import nn

from orchestrator.geometry.spaces import Space
from orchestrator.models import weights
from orchestrator.models.encoder_config import HUB, EncoderConfig
from orchestrator.models.outputs import ModelOutput

__all__ = ["HUB", "Encoder", "EncoderConfig", "adapt_stem_to_small_input", "create_backbone"]


def adapt_stem_to_small_input(backbone: nn.Module, arch: str) -> None:
    """Make a ResNet-family stem keep 32x32 resolution (CIFAR-style), in place.

    Rule (models with ``conv1`` and ``maxpool``, i.e. timm ResNet variants):
    - ``conv1`` a single Conv2d (ImageNet 7x7/2 stem): replaced by a fresh 3x3 stride-1 conv with the
      same channels (the usual CIFAR ResNet stem);
    - ``conv1`` a Sequential deep stem (``resnet*d``/``*t``, ``test_resnet``): its first conv gets
      stride 1, weights kept;
    - ``maxpool`` replaced by Identity.
    Decision: other families raise ValueError: no generic rule is safe (ViTs need a new patch size
    and position embedding, ConvNeXt/EfficientNet stems differ per model), and a silently wrong
    downsampling would waste a whole training run.
    """
    conv1 = getattr(backbone, "conv1", None)
    if conv1 is None or not hasattr(backbone, "maxpool"):
        raise ValueError(
            f"small_input=True is only supported for ResNet-like timm models (with conv1 and maxpool); "
            f"arch={arch!r} has none"
        )
    if isinstance(conv1, nn.Conv2d):
        backbone.conv1 = nn.Conv2d(conv1.in_channels, conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
    elif isinstance(conv1, nn.Sequential) and isinstance(conv1[0], nn.Conv2d):
        conv1[0].stride = (1, 1)
    else:
        raise ValueError(f"small_input=True: unrecognised conv1 stem of type {type(conv1).__name__} in arch={arch!r}")
    backbone.maxpool = nn.Identity()


def create_backbone(config: EncoderConfig) -> nn.Module:
    """The timm backbone without classifier (``num_classes=0``), stem adapted; with "hub", timm
    loads its weights at creation (a local checkpoint is loaded by ``Encoder``, into the backbone
    and the projection)."""
    kwargs: dict[str, Any] = dict(num_classes=0, in_chans=config.in_chans, drop_rate=config.drop_rate)
    if not timm.is_model(config.arch):
        raise ValueError(f"arch must be a timm model name, got {config.arch!r}")
    if config.pretrained == HUB:
        backbone = weights.create_hub_backbone(config.arch, **kwargs)
    else:
        backbone = timm.create_model(config.arch, pretrained=False, **kwargs)
    if config.small_input:
        adapt_stem_to_small_input(backbone, config.arch)
    return backbone


class Encoder(nn.Module):
    """x (B, C, H, W) -> backbone (B, F) -> Linear (B, embed_dim) -> lift -> ModelOutput(features, embedding).

    ``lift`` is one of ``orchestrator.models.lifts`` and fixes ``space`` and ``curv``. ``logits`` is None.
    """

    def __init__(self, config: EncoderConfig, lift: nn.Module):
        super().__init__()
        self.config = config
        self.backbone = create_backbone(config)
        self.projection = nn.Linear(self.backbone.num_features, config.embed_dim)
        if config.pretrained not in (None, HUB):
            # after the stem is adapted: a checkpoint saved from an adapted backbone loads fully, an
            # ImageNet one all but the replaced stem conv (skipped for its shape, and logged)
            weights.load_encoder_weights(self.backbone, self.projection, config.pretrained)
        self.lift = lift
        if config.freeze_backbone:
            self.backbone.requires_grad_(False)
            self.backbone.eval()

    @property
    def space(self) -> Space:
        return self.lift.space

    @property
    def embed_dim(self) -> int:
        return self.config.embed_dim

    def train(self, mode: bool = True) -> Encoder:
        """Like ``nn.Module.train``, but a frozen backbone stays in eval mode (BatchNorm statistics fixed)."""
        super().train(mode)
        if self.config.freeze_backbone:
            self.backbone.eval()
        return self

    def forward(self, images: torch.Tensor) -> ModelOutput:
        features, embedding = self.lift(self.projection(self.backbone(images)))
        return ModelOutput(features=features, embedding=embedding)
