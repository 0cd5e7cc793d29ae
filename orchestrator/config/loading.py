"""``load_pipeline``: read a pipeline file, apply the command line's overrides, validate it."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.config.pipeline import PipelineConfig
from orchestrator.config.problems import PipelineConfigError, field_path
from orchestrator.config.yaml_errors import read_yaml_mapping, validate_yaml_mapping


def load_pipeline(path: str | Path, overrides: Mapping[str, Any] | None = None) -> PipelineConfig:
    """Read and validate a pipeline file.

    ``overrides`` maps dotted field paths to values (``{"storage": "s3://b/x", "ray.address":
    "auto", "generations.0.training.epochs": 1}``), applied to the raw YAML before validation; a
    None value sets the field to null (``--set gallery.source=null``). Raises ``PipelineConfigError`` with one line per problem, each naming
    the file, the field path and the bad value (YAML syntax errors: the line and column).
    """
    file, raw, root = read_yaml_mapping(path, "pipeline fields (name, data, generations, ...)")
    raw, overridden = _apply_overrides(file, raw, overrides or {})
    return validate_yaml_mapping(PipelineConfig, file, raw, root, overridden)


def _unshared(value: Any) -> Any:
    """A copy in which no two places share a dict or list: YAML aliases (*anchor) load as one shared
    object, and an override of one generation's field must not change the others."""
    if isinstance(value, dict):
        return {key: _unshared(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unshared(item) for item in value]
    return value


def _apply_overrides(file: str, raw: dict, overrides: Mapping[str, Any]) -> tuple[dict, list[tuple]]:
    raw = _unshared(raw)
    applied = []
    for key, value in overrides.items():
        parts: list[Any] = [int(p) if p.isdigit() else p for p in str(key).split(".")]
        node: Any = raw
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            if isinstance(node, dict) and isinstance(part, str):
                if last:
                    node[part] = _unshared(value)
                else:
                    node = node.setdefault(part, {})
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                if last:
                    node[part] = _unshared(value)
                else:
                    node = node[part]
            else:
                raise PipelineConfigError(file, [f"override {key}: {field_path(tuple(parts[:depth])) or '(top level)'} "
                                                 f"has no field {part!r}"])
        applied.append(tuple(parts))
    return raw, applied
