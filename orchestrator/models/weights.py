"""Pretrained encoder weights (backbone and projection): safe local checkpoint loading, and timm's hub
download with a clear offline error.

Only tensors are ever read: ``.safetensors`` through ``safetensors.torch.load_file`` and torch
checkpoints through ``torch.load(weights_only=True)``, which refuses arbitrary pickled objects.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import safetensors.torch
import timm
import torch
from torch import nn

_logger = logging.getLogger(__name__)

TORCH_CHECKPOINT_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
#: Keys under which training scripts commonly nest the state dict (timm, torchvision, lightning, DDP,
#: and ``net``: the d-Simplex code's checkpoints, stationary_dsimplex.md).
_NESTED_STATE_DICT_KEYS = ("state_dict", "model", "model_state_dict", "module", "net")
#: Encoder checkpoints: their backbone's keys carry this prefix ...
_BACKBONE_PREFIX = "backbone."
#: ... and their projection to the embedding is one of these (this project's ``Encoder``; the
#: d-Simplex code's ``Incremental_ResNet``, whose ``fc1`` has no bias).
_PROJECTION_KEYS = {"projection.weight": "weight", "projection.bias": "bias", "fc1.weight": "weight"}
#: A generation file of this project holds its encoder under this prefix (beside its head).
_GENERATION_ENCODER_PREFIX = "encoder."


@dataclass
class LoadReport:
    """What a checkpoint load did: backbone keys loaded, missing in the checkpoint, not in the
    module, shape-skipped (``mismatched`` also names a skipped ``projection.weight``); and whether
    the projection to the embedding was loaded."""

    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    projection_loaded: bool = False


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict of tensors from a local ``.safetensors`` or torch checkpoint (.pth/.pt/.bin/.ckpt).

    A torch checkpoint that nests its weights under ``state_dict`` / ``model`` / ``model_state_dict`` /
    ``module`` / ``net`` is unwrapped, and a leading ``module.`` (DataParallel) is stripped from every key.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pretrained weights file not found: {str(path)!r}")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        state: Any = safetensors.torch.load_file(str(path), device="cpu")
    elif suffix in TORCH_CHECKPOINT_SUFFIXES:
        state = torch.load(path, map_location="cpu", weights_only=True)
    else:
        raise ValueError(
            f"pretrained must be a .safetensors or {'/'.join(TORCH_CHECKPOINT_SUFFIXES)} file or 'hub', got {str(path)!r}"
        )
    while isinstance(state, Mapping) and not any(torch.is_tensor(v) for v in state.values()):
        nested = next((state[k] for k in _NESTED_STATE_DICT_KEYS if isinstance(state.get(k), Mapping)), None)
        if nested is None:
            break
        state = nested
    if not isinstance(state, Mapping):
        raise ValueError(f"checkpoint {str(path)!r} does not hold a state dict (got {type(state).__name__})")
    return {k.removeprefix("module."): v for k, v in state.items() if torch.is_tensor(v)}


def split_encoder_state(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(backbone tensors, projection tensors ``{"weight", "bias"}``) of a checkpoint's state dict.

    Layouts:
    - a backbone alone (timm / torchvision names, ``conv1.weight``, ``layer1.0.conv1.weight``, ...):
      all of it is the backbone, and there is no projection;
    - an encoder, recognised by keys under ``backbone.``: those keys without the prefix are the
      backbone, and ``projection.weight`` / ``projection.bias`` (this project) or ``fc1.weight``
      (the d-Simplex code, stationary_dsimplex.md §4.2) the projection; a generation file of this
      project holds both under ``encoder.``. Its other keys (a classifier: ``fc2.weight``,
      ``head.*``) stay in the backbone part under their own names, to be reported unexpected.
    """
    state = {(k.removeprefix(_GENERATION_ENCODER_PREFIX)
              if k.startswith(_GENERATION_ENCODER_PREFIX + _BACKBONE_PREFIX)
              or k.removeprefix(_GENERATION_ENCODER_PREFIX) in _PROJECTION_KEYS else k): v
             for k, v in state.items()}
    if not any(k.startswith(_BACKBONE_PREFIX) for k in state):
        return dict(state), {}
    backbone = {k.removeprefix(_BACKBONE_PREFIX): v for k, v in state.items() if k not in _PROJECTION_KEYS}
    projection = {_PROJECTION_KEYS[k]: v for k, v in state.items() if k in _PROJECTION_KEYS}
    return backbone, projection


def _module_key(key: str, target: Mapping[str, torch.Tensor]) -> str:
    """``key`` as ``target`` names it: the d-Simplex code's pretrained checkpoints write a ResNet
    stage's blocks as ``layer1.blocks.0.*`` where torchvision and timm write ``layer1.0.*`` (its
    loader drops ``.blocks.``); renamed only when the plain name is the module's and ``key`` is not."""
    if key in target or ".blocks." not in key:
        return key
    plain = key.replace(".blocks.", ".")
    return plain if plain in target else key


def load_encoder_weights(backbone: nn.Module, projection: nn.Linear, path: str | Path) -> LoadReport:
    """Load a local checkpoint (``split_encoder_state``'s layouts) into an encoder's backbone and
    projection, non-strictly; raise ValueError if no backbone key matches.

    Backbone keys whose shapes differ from the module's (e.g. a 7x7 ImageNet stem into a 3x3
    small-input stem) are skipped and reported, never loaded. The projection is loaded when the
    checkpoint has one of the same shape (a different ``embed_dim`` is skipped and reported); a
    projection saved without bias (the d-Simplex code's ``fc1``) loads with a zero bias, so the
    embedding is the checkpoint's own. Missing / unexpected / skipped counts are logged.
    """
    backbone_state, projection_state = split_encoder_state(read_state_dict(path))
    target = backbone.state_dict()
    report = LoadReport()
    loadable = {}
    for key, tensor in backbone_state.items():
        name = _module_key(key, target)
        if name not in target:
            report.unexpected.append(key)
        elif tuple(tensor.shape) != tuple(target[name].shape):
            report.mismatched.append(name)
        else:
            loadable[name] = tensor
    if not loadable:
        raise ValueError(
            f"no key of checkpoint {str(path)!r} matches the backbone "
            f"({len(backbone_state)} checkpoint keys, e.g. {sorted(backbone_state)[:3]}; backbone keys e.g. {sorted(target)[:3]})"
        )
    backbone.load_state_dict(loadable, strict=False)
    report.loaded = sorted(loadable)
    report.missing = sorted(set(target) - set(loadable))
    if "weight" in projection_state:
        weight = projection_state["weight"]
        if tuple(weight.shape) != tuple(projection.weight.shape):
            report.mismatched.append("projection.weight")
        else:
            bias = projection_state.get("bias", torch.zeros(projection.out_features))
            with torch.no_grad():
                projection.weight.copy_(weight)
                projection.bias.copy_(bias)
            report.projection_loaded = True
    _logger.info(
        "loaded %d tensors from %s: %d missing, %d unexpected, %d skipped for shape mismatch; projection %s",
        len(report.loaded), path, len(report.missing), len(report.unexpected), len(report.mismatched),
        "loaded" if report.projection_loaded else "not loaded (initialised at random)",
    )
    if report.mismatched:
        _logger.warning("shape-mismatched keys not loaded from %s: %s", path, report.mismatched)
    return report


def create_hub_backbone(arch: str, **create_kwargs: Any) -> nn.Module:
    """``timm.create_model(arch, pretrained=True, **create_kwargs)``; offline raises a clear RuntimeError.

    timm downloads through ``huggingface_hub`` (or ``torch.hub`` for URL weights); offline these
    raise subclasses of ``OSError`` (``LocalEntryNotFoundError``, ``ConnectionError``, ``URLError``).
    """
    try:
        return timm.create_model(arch, pretrained=True, **create_kwargs)
    except OSError as error:
        raise RuntimeError(
            f"could not download pretrained weights for arch {arch!r} from the hub (offline or unreachable: "
            f"{type(error).__name__}); give a local path in pretrained (.safetensors or .pth/.bin)"
        ) from error
