"""The generation checkpoint format (safetensors + JSON card with sha256).

A generation checkpoint is a folder ``<uri>/``::

    model.safetensors   the CompatibleModel's state_dict (encoder, head, seen_classes, adapters;
                        never the training-only ``auxiliary`` modules)
    card.json           what is needed to rebuild the model and check the weights (``CheckpointCard``)

Write order: an existing ``card.json`` is removed first, then the weights are written atomically,
then the card (atomically). A crash therefore leaves either no card (= no checkpoint: a re-run
writes it again) or a complete checkpoint; a card is never left describing other weights, and
``read_weights`` checks the sha256 of the bytes it reads against the card anyway.

Loading (``orchestrator.methods.loading.load_generation``) rebuilds the model from the card alone:
the method the card names builds the model (``build_model(EncoderConfig(**encoder, pretrained=None),
num_classes, seen_classes)``, without the training-only auxiliary modules it builds), then
``restore_weights`` here adds the adapters the card lists (``build_adapter`` of the adapter
registry, so a plug-in's adapter kind is rebuilt as a built-in one) and loads the verified bytes
(``read_weights``: ``safetensors.torch.load``) with ``load_state_dict(strict=True)``.
Nothing is unpickled anywhere in this module.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Mapping, Protocol

import safetensors.torch
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from orchestrator.models.adapters import adapter_spec, build_adapter
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.checkpoint_layout import CARD_FILE, WEIGHTS_FILE
from orchestrator.models.encoder import EncoderConfig
from orchestrator.storage.filesystem import (
    exists,
    join_uri,
    read_bytes,
    read_versioned_json,
    redact_uri,
    remove,
    write_bytes_atomic,
    write_json_atomic,
)
from orchestrator.storage.hashing import ChecksumMismatch, sha256_hex

CARD_FORMAT_VERSION = 2  # 2: adapters described by adapter kind (1: by the method that built them)


class DescribedMethod(Protocol):
    """What a checkpoint needs of the method that trained the model (``CompatibilityMethod``)."""

    def describe(self) -> dict[str, Any]:
        """``{"name": registry name, "space": space value, "params": parameter values}``."""
        ...


# --- the card ----------------------------------------------------------------------------------
class MethodSpec(BaseModel):
    """``CompatibilityMethod.describe()``: the method's registry name, space and parameter values."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    space: str
    params: dict[str, Any] = Field(default_factory=dict)


class CheckpointCard(BaseModel):
    """``card.json`` of a generation checkpoint.

    format_version: version of this layout (``CARD_FORMAT_VERSION``); newer cards are refused.
    name / parent:  the generation's name and its parent's (None for a first generation).
    method:         ``method.describe()``.
    encoder:        ``EncoderConfig.model_dump()`` as trained (``pretrained`` kept as provenance;
                    loading ignores it, the weights come from the checkpoint).
    num_classes:    ``model.num_classes``, the head's label-space size, passed back to ``build_model``
                    (for d-Simplex that is K, all pre-allocated prototypes, which rebuilds the same head).
    seen_classes, space, curv: the classes trained on, the embedding space and its curvature
                    magnitude (0 for flat spaces).
    adapters:       adapter slot → spec to rebuild it (``describe_adapters``: the adapter registry's
                    ``{"kind": ..., ...}``; format 1 named the building method, read by
                    ``card_adapter_specs``).
    weights_file, sha256, num_bytes: the safetensors file and its hash / size.
    created_at:     UTC time of the save.
    extra:          caller's JSON metadata (metrics, data scenario, ...).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    format_version: int = CARD_FORMAT_VERSION
    name: str
    parent: str | None = None
    method: MethodSpec
    encoder: dict[str, Any]
    num_classes: int = Field(gt=0)
    seen_classes: list[int]
    space: str
    curv: float
    adapters: dict[str, dict[str, Any]] = Field(default_factory=dict)
    weights_file: str = WEIGHTS_FILE
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    num_bytes: int = Field(ge=0)
    created_at: datetime
    extra: dict[str, Any] = Field(default_factory=dict)

    def encoder_config(self) -> EncoderConfig:
        return EncoderConfig(**self.encoder)


# --- adapters: described on save, rebuilt on load, through the adapter registry ------------------
def describe_adapters(model: CompatibleModel) -> dict[str, dict[str, Any]]:
    """Adapter slot → spec (``orchestrator.models.adapters.adapter_spec``) from which
    ``rebuild_adapters`` recreates the module structure. An adapter whose class is not a registered
    adapter kind is a ValueError at save time, rather than a checkpoint that cannot be loaded."""
    specs: dict[str, dict[str, Any]] = {}
    for name, module in model.adapters.items():
        try:
            specs[name] = adapter_spec(module)
        except ValueError as error:
            raise ValueError(f"cannot checkpoint adapter {name!r}: {error}") from None
    return specs


def rebuild_adapters(model: CompatibleModel, specs: Mapping[str, Mapping[str, Any]]) -> None:
    """Add freshly built adapters described by ``specs`` (``describe_adapters``) to ``model``, in place."""
    for name, spec in specs.items():
        try:
            model.adapters[name] = build_adapter(spec)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"cannot rebuild adapter {name!r} from {dict(spec)!r}: {error}") from None


def _format_1_adapter_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """An adapter spec of a format-1 card (named after the method that built the adapter: the
    ``lambda_orth`` and ``fct`` builders) as the adapter kinds' spec of the same module structure."""
    builder, role = spec.get("builder"), spec.get("role")
    try:
        new_dim = int(spec["new_dim"])
        old_dim = int(spec["old_dim"]) if spec.get("old_dim") is not None else new_dim
        if builder == "fct" and role == "forward" and spec["form"] == "mlp":
            inner = {"kind": "mlp", "in_dim": old_dim, "out_dim": new_dim, "hidden_dim": int(spec.get("hidden_dim") or 1)}
        elif (builder == "fct" and role == "forward" and spec["form"] == "affine") or (
                builder == "lambda_orth" and role == "forward"):
            inner = {"kind": "affine", "in_dim": old_dim, "out_dim": new_dim, "bias": True}
        elif builder == "lambda_orth" and role == "backward" and spec.get("variant", "orthogonal") == "orthogonal":
            inner = {"kind": "orthogonal", "dim": new_dim}
        elif builder == "lambda_orth" and role == "backward" and spec["variant"] == "lambda":
            inner = {"kind": "affine", "in_dim": new_dim, "out_dim": new_dim, "bias": True}
        else:
            raise ValueError("unknown builder, role, form or variant")
        return {"kind": "embedding_map", "normalize_input": bool(spec["normalize_inputs"]), "map": inner}
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"unknown format-1 adapter spec {dict(spec)!r}: {error}") from None


def card_adapter_specs(card: CheckpointCard) -> dict[str, dict[str, Any]]:
    """The card's adapter specs in the adapter kinds' form (format-1 cards translated)."""
    if card.format_version >= 2:
        return {name: dict(spec) for name, spec in card.adapters.items()}
    return {name: _format_1_adapter_spec(spec) for name, spec in card.adapters.items()}


# --- state dicts ----------------------------------------------------------------------------------
def cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy owning its storage (safetensors refuses shared or strided storage)."""
    return tensor.detach().to("cpu", copy=True).contiguous()


def _adopt_saved_dtypes(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Give floating-point parameters / buffers the dtype they were saved with, so that
    ``load_state_dict`` (which copies, casting to the module's dtype) is exact when e.g. an adapter
    was fitted in float64 while the builders make float32."""
    for prefix, module in model.named_modules():
        for slots in (module._parameters, module._buffers):
            for key, value in slots.items():
                full = f"{prefix}.{key}" if prefix else key
                saved = state.get(full)
                if value is None or saved is None or saved.dtype == value.dtype:
                    continue
                if saved.dtype.is_floating_point and value.dtype.is_floating_point:
                    if isinstance(value, nn.Parameter):
                        value.data = value.data.to(saved.dtype)
                    else:
                        slots[key] = value.to(saved.dtype)


def save_generation(
    model: CompatibleModel,
    method: DescribedMethod,
    encoder_config: EncoderConfig | None,
    uri: str,
    name: str,
    parent: str | None = None,
    extra: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> CheckpointCard:
    """Write ``model`` as the generation checkpoint folder ``uri`` and return its card.

    ``encoder_config`` None means the model's own (``model.encoder.config``); a config different
    from the model's is a ValueError, as is a method whose space is not the model's (the card would
    rebuild another model). ``extra`` must be JSON-serialisable.
    """
    model_config = getattr(model.encoder, "config", None)
    if encoder_config is None:
        if model_config is None:
            raise ValueError("save_generation: encoder_config is required (the model's encoder has no config)")
        encoder_config = model_config
    elif model_config is not None and EncoderConfig.model_validate(encoder_config.model_dump()) != model_config:
        raise ValueError(
            f"save_generation: encoder_config {encoder_config.model_dump()} differs from the model's "
            f"{model_config.model_dump()}"
        )
    description = method.describe()
    if description["space"] != model.space.value:
        raise ValueError(
            f"save_generation: method {description['name']!r} is in the {description['space']} space but the "
            f"model embeds in {model.space.value}"
        )
    adapters = describe_adapters(model)
    # the deployed generation: training-only modules (AdvBCT's discriminator, ...) stay behind
    state = {key: cpu_copy(value) for key, value in model.deployable_state_dict().items()}
    data = safetensors.torch.save(state, metadata={"format": "pt"})
    card = CheckpointCard(
        name=name,
        parent=parent,
        method=MethodSpec(**description),
        encoder=encoder_config.model_dump(mode="json"),
        num_classes=model.num_classes,
        seen_classes=[int(c) for c in model.seen_classes.tolist()],
        space=model.space.value,
        curv=model.curv,
        adapters=adapters,
        sha256=sha256_hex(data),
        num_bytes=len(data),
        created_at=datetime.now(timezone.utc),
        extra=dict(extra or {}),
    )
    card_json = card.model_dump(mode="json")
    json.dumps(card_json, allow_nan=False)  # a non-JSON ``extra`` fails here, before any write
    remove(join_uri(uri, CARD_FILE), missing_ok=True, storage_options=storage_options)
    write_bytes_atomic(join_uri(uri, WEIGHTS_FILE), data, storage_options)
    write_json_atomic(join_uri(uri, CARD_FILE), card_json, storage_options)
    return card


def checkpoint_exists(uri: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Whether ``uri`` holds a complete generation checkpoint (its card is written last)."""
    return exists(join_uri(uri, CARD_FILE), storage_options)


def load_card(uri: str, storage_options: Mapping[str, Any] | None = None) -> CheckpointCard:
    """The card of the checkpoint at ``uri``. FileNotFoundError naming ``uri`` if there is none;
    ValueError for a card of a newer format or with invalid fields."""
    raw = read_versioned_json(uri, CARD_FILE, "checkpoint card", CARD_FORMAT_VERSION, storage_options)
    return CheckpointCard.model_validate(raw)


def read_weights(
    uri: str, expected_sha256: str | None = None, storage_options: Mapping[str, Any] | None = None,
) -> tuple[dict[str, torch.Tensor], CheckpointCard]:
    """The state dict saved at ``uri`` and its card.

    The sha256 of the weight bytes is checked against the card (and ``expected_sha256``, e.g. the
    lineage's record) BEFORE deserialising: ``ChecksumMismatch`` names the uri and both hashes.
    Missing card or weights: FileNotFoundError naming ``uri``.
    """
    card = load_card(uri, storage_options)
    weights_uri = join_uri(uri, card.weights_file)
    try:
        data = read_bytes(weights_uri, storage_options)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"checkpoint {redact_uri(uri)} has a card but no weights file {card.weights_file}") from exc
    actual = sha256_hex(data)
    if actual != card.sha256:
        raise ChecksumMismatch(weights_uri, card.sha256, actual)
    if expected_sha256 is not None and actual != expected_sha256.lower():
        raise ChecksumMismatch(weights_uri, expected_sha256, actual)
    return safetensors.torch.load(data), card


def restore_weights(model: CompatibleModel, state: Mapping[str, torch.Tensor], card: CheckpointCard, uri: str) -> None:
    """Fill ``model``, freshly built by the card's method, in place with ``state`` (``read_weights``):
    the training-only modules dropped (none were saved), the card's adapters rebuilt, the saved
    dtypes adopted, then ``load_state_dict(strict=True)``. A model of another space than the card's
    is a ValueError naming ``uri``."""
    model.auxiliary.clear()
    rebuild_adapters(model, card_adapter_specs(card))
    if model.space.value != card.space:
        raise ValueError(f"{redact_uri(uri)}: card says space {card.space!r}, the rebuilt model embeds in {model.space.value!r}")
    _adopt_saved_dtypes(model, state)
    model.load_state_dict(state, strict=True)


__all__ = [
    "CARD_FILE",
    "CARD_FORMAT_VERSION",
    "WEIGHTS_FILE",
    "CheckpointCard",
    "DescribedMethod",
    "MethodSpec",
    "card_adapter_specs",
    "checkpoint_exists",
    "cpu_copy",
    "describe_adapters",
    "load_card",
    "read_weights",
    "rebuild_adapters",
    "restore_weights",
    "save_generation",
]
