"""Resumable training state: an optimizer ``state_dict()``, the epoch and ``extra`` (RNG states, a
scheduler's state) written without pickle (``save_training_state`` / ``load_training_state``).

The state is a folder ``<uri>/``::

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

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

import safetensors.torch
import torch

from orchestrator.models.checkpoint import cpu_copy
from orchestrator.storage.filesystem import (
    join_uri,
    read_bytes,
    read_versioned_json,
    redact_uri,
    remove,
    write_bytes_atomic,
    write_json_atomic,
)
from orchestrator.storage.hashing import ChecksumMismatch, sha256_hex

TRAINING_STATE_FORMAT_VERSION = 1
TRAINING_TENSORS_FILE = "training_state.safetensors"
TRAINING_STATE_FILE = "training_state.json"

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
        tensors[key] = cpu_copy(obj)
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
    document = read_versioned_json(uri, TRAINING_STATE_FILE, "training state", TRAINING_STATE_FORMAT_VERSION,
                                   storage_options)
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
