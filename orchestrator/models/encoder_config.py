"""``EncoderConfig``: the settings of one generation's encoder, validated without torch or timm
(pipeline files are checked before either is imported; ``orchestrator.models.encoder`` builds it)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from orchestrator import limits

HUB = "hub"


class EncoderConfig(BaseModel):
    """Backbone and projection settings of one generation's encoder.

    arch:            timm model name (``timm.list_models()``); e.g. "resnet18", "resnet10t", "test_resnet".
    embed_dim:       size d of the projection output (HBCT: 128; d-Simplex: K-1).
    small_input:     adapt a ResNet stem to 32x32 images (see ``adapt_stem_to_small_input``).
    pretrained:      None (random init), a local ``.safetensors`` / ``.pth`` / ``.pt`` / ``.bin`` / ``.ckpt``
                     path, or "hub" for timm's own download (needs network). A local file loads into
                     the backbone, and into the projection too when it holds one of the same shape
                     (a generation file of this project; the d-Simplex code's ``fc1``): see
                     ``orchestrator.models.weights.split_encoder_state``.
    freeze_backbone: backbone frozen (no grads, always in eval mode); the projection still trains.
    in_chans:        input channels.
    drop_rate:       timm's dropout before the (removed) classifier, i.e. on the pooled feature.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    arch: str = "resnet18"
    embed_dim: int = Field(128, gt=0, le=limits.MAX_EMBED_DIM)
    small_input: bool = False
    pretrained: str | None = None
    freeze_backbone: bool = False
    in_chans: int = Field(3, gt=0, le=limits.MAX_CHANNELS)
    drop_rate: float = Field(0.0, ge=0.0, lt=1.0)
