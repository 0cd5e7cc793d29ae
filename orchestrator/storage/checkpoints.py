"""Generation checkpoints (safetensors + JSON card with sha256) and resumable training state.

A generation checkpoint is a folder ``<uri>/``::

    model.safetensors   the CompatibleModel's state_dict (encoder, head, seen_classes, adapters;
                        never the training-only ``auxiliary`` modules)
    card.json           what is needed to rebuild the model and check the weights (``CheckpointCard``)

Write order: an existing ``card.json`` is removed first, then the weights are written atomically,
then the card (atomically). A crash therefore leaves either no card (= no checkpoint: a re-run
writes it again) or a complete checkpoint; a card is never left describing other weights, and
``load_generation`` checks the sha256 of the bytes it reads against the card anyway.

Loading rebuilds the model from the card alone: ``create_method(name, params).build_model(
EncoderConfig(**encoder, pretrained=None), num_classes, seen_classes)``, without the training-only
auxiliary modules it builds, then the adapters the card lists (``build_adapter`` of the adapter
registry, so a plug-in's adapter kind is rebuilt as a built-in one), then ``load_state_dict(strict=True)``
of ``safetensors.torch.load`` of the verified bytes.
Nothing is unpickled anywhere in this module.

Training state (``save_training_state`` / ``load_training_state``) is a folder ``<uri>/``::

    training_state.safetensors  every tensor of the state, flattened under keys "t0", "t1", ...
    training_state.json         format version, epoch, sha256 of the tensors file, and the
                                non-tensor structure of the optimizer state and ``extra``

The structure is JSON with tagged values, so any nest of dicts / lists / tuples / scalars /
tensors (an optimizer ``state_dict()``, a scheduler's, RNG states) comes back exactly:
``{"__tensor__": "t3"}`` a tensor, ``{"__tuple__": [...]}`` a tuple (Adam's ``betas``),
``{"__dict__": [[key, value], ...]}`` a dict with a non-string key (the optimizer's integer
parameter ids) or a key starting with ``"__"``, ``{"__float__": "nan"}`` a non-finite float; other
dicts, lists, str, int, float, bool and None are plain JSON. Two references to one tensor are
stored as two tensors (aliasing is not preserved).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

import safetensors.torch
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from orchestrator.methods.base import CompatibilityMethod
from orchestrator.methods.registry import create_method
from orchestrator.models.adapters import adapter_spec, build_adapter
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.encoder import EncoderConfig
from orchestrator.storage.checkpoint_layout import CARD_FILE, WEIGHTS_FILE
from orchestrator.storage.hashing import ChecksumMismatch, sha256_hex
from orchestrator.storage.filesystem import (
    exists,
    join_uri,
    read_bytes,
    read_json,
    redact_uri,
    remove,
    write_bytes_atomic,
    write_json_atomic,
)

CARD_FORMAT_VERSION = 2  # 2: adapters described by adapter kind (1: by the method that built them)
TRAINING_STATE_FORMAT_VERSION = 1
TRAINING_TENSORS_FILE = "training_state.safetensors"
TRAINING_STATE_FILE = "training_state.json"


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
def _cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
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
    method: CompatibilityMethod,
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
    state = {key: _cpu_copy(value) for key, value in model.deployable_state_dict().items()}
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
    try:
        raw = read_json(join_uri(uri, CARD_FILE), storage_options)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"no checkpoint card ({CARD_FILE}) at {redact_uri(uri)}") from exc
    version = raw.get("format_version") if isinstance(raw, dict) else None
    if not isinstance(version, int) or version > CARD_FORMAT_VERSION:
        raise ValueError(
            f"{redact_uri(join_uri(uri, CARD_FILE))}: unsupported card format_version {version!r} "
            f"(this code reads up to {CARD_FORMAT_VERSION})"
        )
    return CheckpointCard.model_validate(raw)


def load_generation(
    uri: str,
    expected_sha256: str | None = None,
    map_location: str | torch.device = "cpu",
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[CompatibleModel, CheckpointCard]:
    """Rebuild the generation saved at ``uri``: ``(model in eval mode on map_location, card)``.

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
    state = safetensors.torch.load(data)

    method = create_method(card.method.name, card.method.params)
    # Decision: the backbone's ``pretrained`` init is not loaded again (the checkpoint holds every
    # weight; a hub download or a path of the training machine must not be needed to load).
    encoder_config = card.encoder_config().model_copy(update={"pretrained": None})
    model = method.build_model(encoder_config, card.num_classes, torch.tensor(card.seen_classes, dtype=torch.long))
    model.auxiliary.clear()  # a deployed generation has no training-only modules (none were saved)
    rebuild_adapters(model, card_adapter_specs(card))
    if model.space.value != card.space:
        raise ValueError(f"{redact_uri(uri)}: card says space {card.space!r}, the rebuilt model embeds in {model.space.value!r}")
    _adopt_saved_dtypes(model, state)
    model.load_state_dict(state, strict=True)
    return model.to(map_location).eval(), card


# --- training state ----------------------------------------------------------------------------------
TENSOR_TAG, TUPLE_TAG, DICT_TAG, FLOAT_TAG = "__tensor__", "__tuple__", "__dict__", "__float__"


@dataclass
class TrainingState:
    """What ``load_training_state`` returns: the optimizer ``state_dict()`` (as saved), the epoch and ``extra``."""

    optimizer_state: dict[str, Any]
    epoch: int
    extra: dict[str, Any] = field(default_factory=dict)
    created_at: str | None = None


def _encode(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = _cpu_copy(obj)
        return {TENSOR_TAG: key}
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {FLOAT_TAG: repr(obj)}
    if isinstance(obj, tuple):
        return {TUPLE_TAG: [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {DICT_TAG: [[_encode(k, tensors, f"{where}<key>"), _encode(v, tensors, f"{where}[{k!r}]")] for k, v in obj.items()]}
    raise TypeError(f"training state: cannot store {type(obj).__name__} at {where} (tensors, containers and JSON scalars only)")


def _decode(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1:
            (tag, value), = obj.items()
            if tag == TENSOR_TAG:
                return tensors[value]
            if tag == TUPLE_TAG:
                return tuple(_decode(v, tensors) for v in value)
            if tag == DICT_TAG:
                return {_decode(k, tensors): _decode(v, tensors) for k, v in value}
            if tag == FLOAT_TAG:
                return float(value)
        return {k: _decode(v, tensors) for k, v in obj.items()}
    return obj


def save_training_state(
    uri: str,
    optimizer_state: Mapping[str, Any],
    epoch: int,
    extra: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> str:
    """Write an optimizer ``state_dict()``, the epoch and ``extra`` (which may hold tensors, e.g. RNG
    states) to the folder ``uri`` without pickle (format in the module docstring). Tensors first,
    the JSON (with their sha256) last. Returns the sha256 of the tensors file."""
    tensors: dict[str, torch.Tensor] = {}
    structure = {
        "optimizer": _encode(dict(optimizer_state), tensors, "optimizer_state"),
        "extra": _encode(dict(extra or {}), tensors, "extra"),
    }
    data = safetensors.torch.save(tensors, metadata={"format": "pt"})
    document = {
        "format_version": TRAINING_STATE_FORMAT_VERSION,
        "epoch": int(epoch),
        "tensors_file": TRAINING_TENSORS_FILE,
        "sha256": sha256_hex(data),
        "num_tensors": len(tensors),
        "created_at": datetime.now(timezone.utc).isoformat(),
        "state": structure,
    }
    remove(join_uri(uri, TRAINING_STATE_FILE), missing_ok=True, storage_options=storage_options)
    write_bytes_atomic(join_uri(uri, TRAINING_TENSORS_FILE), data, storage_options)
    # key order kept: the state comes back as the same dicts, in the same order
    write_json_atomic(join_uri(uri, TRAINING_STATE_FILE), document, storage_options, sort_keys=False)
    return document["sha256"]


def load_training_state(
    uri: str, map_location: str | torch.device = "cpu", storage_options: Mapping[str, Any] | None = None
) -> TrainingState:
    """Read what ``save_training_state`` wrote at ``uri`` (tensors on ``map_location``).
    FileNotFoundError naming ``uri`` if absent; ChecksumMismatch if the tensors file was altered."""
    try:
        document = read_json(join_uri(uri, TRAINING_STATE_FILE), storage_options)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"no training state ({TRAINING_STATE_FILE}) at {redact_uri(uri)}") from exc
    version = document.get("format_version") if isinstance(document, dict) else None
    if not isinstance(version, int) or version > TRAINING_STATE_FORMAT_VERSION:
        raise ValueError(f"{redact_uri(uri)}: unsupported training state format_version {version!r}")
    tensors_uri = join_uri(uri, document["tensors_file"])
    try:
        data = read_bytes(tensors_uri, storage_options)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"training state {redact_uri(uri)} has no tensors file {document['tensors_file']}") from exc
    actual = sha256_hex(data)
    if actual != document["sha256"]:
        raise ChecksumMismatch(tensors_uri, document["sha256"], actual)
    tensors = {k: v.to(map_location) for k, v in safetensors.torch.load(data).items()}
    state = _decode(document["state"], tensors)
    return TrainingState(
        optimizer_state=state["optimizer"], epoch=int(document["epoch"]), extra=state["extra"],
        created_at=document.get("created_at"),
    )


__all__ = [
    "CARD_FILE",
    "CARD_FORMAT_VERSION",
    "WEIGHTS_FILE",
    "CheckpointCard",
    "ChecksumMismatch",
    "MethodSpec",
    "TrainingState",
    "card_adapter_specs",
    "checkpoint_exists",
    "describe_adapters",
    "load_card",
    "load_generation",
    "load_training_state",
    "rebuild_adapters",
    "save_generation",
    "save_training_state",
    "sha256_hex",
]
