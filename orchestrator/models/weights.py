"""Pretrained backbone weights: safe local checkpoint loading, and timm's hub download with a clear offline error.

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
#: Keys under which training scripts commonly nest the state dict (timm, torchvision, lightning, DDP).
_NESTED_STATE_DICT_KEYS = ("state_dict", "model", "model_state_dict", "module")


@dataclass
class LoadReport:
    """What a checkpoint load did: keys loaded, missing in the checkpoint, not in the module, shape-skipped."""

    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict of tensors from a local ``.safetensors`` or torch checkpoint (.pth/.pt/.bin/.ckpt).

    A torch checkpoint that nests its weights under ``state_dict`` / ``model`` / ``model_state_dict`` /
    ``module`` is unwrapped, and a leading ``module.`` (DataParallel) is stripped from every key.
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


def load_backbone_weights(module: nn.Module, path: str | Path) -> LoadReport:
    """Load a local checkpoint into ``module`` non-strictly; raise ValueError if no key matches.

    Keys whose shapes differ from the module's (e.g. a 7x7 ImageNet stem into a 3x3 small-input
    stem) are skipped and reported, never loaded. Missing / unexpected / skipped counts are logged.
    """
    checkpoint = read_state_dict(path)
    target = module.state_dict()
    report = LoadReport()
    loadable = {}
    for key, tensor in checkpoint.items():
        if key not in target:
            report.unexpected.append(key)
        elif tuple(tensor.shape) != tuple(target[key].shape):
            report.mismatched.append(key)
        else:
            loadable[key] = tensor
    if not loadable:
        raise ValueError(
            f"no key of checkpoint {str(path)!r} matches the backbone "
            f"({len(checkpoint)} checkpoint keys, e.g. {sorted(checkpoint)[:3]}; backbone keys e.g. {sorted(target)[:3]})"
        )
    module.load_state_dict(loadable, strict=False)
    report.loaded = sorted(loadable)
    report.missing = sorted(set(target) - set(loadable))
    _logger.info(
        "loaded %d tensors from %s: %d missing, %d unexpected, %d skipped for shape mismatch",
        len(report.loaded), path, len(report.missing), len(report.unexpected), len(report.mismatched),
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
