"""The configuration reference, generated from the pydantic models of the pipeline and tune files.

- ``markdown_reference()``: ``docs/configuration.md``, one table per section of each file (field,
  type with its bounds, default, description);
- ``json_schema(kind)``: the JSON Schema of a pipeline (``docs/pipeline.schema.json``) or tune file
  (``docs/tune.schema.json``) for editors, every property with its description, and a built-in
  method's ``params`` checked against that method's ``Params``;
- ``python3 -m orchestrator.config_reference [DIR]`` writes the three files (default ``docs/``);
  ``orchestrator schema [--markdown] [--tune]`` prints them.

Field descriptions come from the models' docstrings, where each field is documented as a line
``name:  text`` (continued by indented lines; ``a / b: text`` documents both) or a bullet
``- ``name``: text``; a field documented nowhere takes the summary line of its model's type.
The method parameters are listed from the built-in methods' ``Params`` models.
"""
from __future__ import annotations

import inspect
import json
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from orchestrator.config import ClassSelection, MethodSpec, PipelineConfig
from orchestrator.tuning.config import TuneSpec

FILES = {"pipeline": PipelineConfig, "tune": TuneSpec}
COMMANDS = {"pipeline": "orchestrator run", "tune": "orchestrator tune"}
EXAMPLES = {"pipeline": "pipelines/lifelong.yaml", "tune": "pipelines/tune.yaml"}
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
# YAML shorthands a model's "before" validator accepts besides its mapping (for editors' schemas)
SHORTHANDS: dict[type[BaseModel], dict[str, Any]] = {
    ClassSelection: {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1,
                     "description": "shorthand for {ids: [...]}"},
}
_FIELD_LINE = re.compile(r"^(?:- )?((?:``)?\w+(?:``)?(?:\s*/\s*(?:``)?\w+(?:``)?)*):\s+(.*)$")


@dataclass(frozen=True)
class Section:
    """One model of a file at one place: ``path`` as a user writes it (``generations[].model``)."""

    path: str
    model: type[BaseModel]


# --------------------------------------------------------------------------- reading the models


def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """``{field: description}`` parsed from the model's docstring (see the module docstring)."""
    docs: dict[str, str] = {}
    current: list[str] | None = None
    for line in (inspect.getdoc(model) or "").splitlines():
        match = _FIELD_LINE.match(line)
        names = [name.strip().strip("`") for name in match.group(1).split("/")] if match else []
        if names and all(name in model.model_fields for name in names):
            current = [match.group(2).strip()]
            for name in names:
                docs[name] = current  # type: ignore[assignment]
        elif current is not None and line.startswith(" ") and line.strip():
            current.append(line.strip())
        else:
            current = None
    return {name: _join(parts) for name, parts in docs.items()}


def _join(parts: list[str]) -> str:
    """Docstring lines as one line (a word hyphenated across lines joined again)."""
    text = ""
    for part in parts:
        text += part if text.endswith("-") and not text.endswith(" -") else (" " if text else "") + part
    return text


def summary(model: type) -> str:
    """The first sentence-line of a class's docstring."""
    doc = inspect.getdoc(model) or ""
    return doc.split("\n\n")[0].replace("\n", " ").strip()


def describe(model: type[BaseModel], name: str) -> str:
    """The description of one field: its docstring entry, else the summary of its model type."""
    text = field_docs(model).get(name)
    if text:
        return text
    nested = list(_models_in(model.model_fields[name].annotation))
    return summary(nested[0]) if nested else ""


def describe_type(annotation: object) -> str:
    """``Literal['a', 'b']`` → ``a|b``; ``float | None`` → ``float|None``; ``list[int]`` →
    ``list[int]``; classes by name."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return describe_type(args[0])
    if origin is Literal:
        return "|".join(str(choice) for choice in args)
    if origin in (list, tuple, dict):
        inner = ", ".join("..." if arg is Ellipsis else describe_type(arg) for arg in args)
        return f"{origin.__name__}[{inner}]" if args else origin.__name__
    if args:
        return "|".join(describe_type(arg) for arg in args)
    if annotation is Any:
        return "any"
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def bounds(field: FieldInfo) -> str:
    """A field's constraints in words: ``≥ 1``, ``> 0, ≤ 1``, ``at least 1 item``, a pattern."""
    words = []
    for item in field.metadata:
        for attribute, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(item, attribute, None) is not None and not isinstance(item, FieldInfo):
                words.append(f"{symbol} {getattr(item, attribute)}")
        if isinstance(item, annotated_types.MinLen):
            words.append(f"at least {item.min_length} item{'s' if item.min_length != 1 else ''}")
        if getattr(item, "pattern", None):
            words.append(f"matches {item.pattern}")
    return ", ".join(words)


def default_text(field: FieldInfo) -> str:
    """A field's default as it would be written in YAML, ``required``, or ``(section)`` for a
    nested model whose own fields give its defaults."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(its fields' defaults)"
    return _yaml_scalar(value)


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value) if value == "" else value
    return json.dumps(value) if isinstance(value, (dict, list)) else repr(value)


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The pydantic models an annotation mentions (through Optional, list, dict, Annotated)."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def _container_suffix(annotation: Any) -> str:
    """``[]`` for a list of models, ``.<name>`` for a mapping of them (Optional unwrapped)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    return {list: "[]", dict: ".<name>"}.get(typing.get_origin(annotation), "")


def sections(root: type[BaseModel]) -> list[Section]:
    """Every model reachable from ``root``, depth first, each at the path a user writes it."""
    found = [Section("", root)]
    for name, field in root.model_fields.items():
        for model in _models_in(field.annotation):
            for section in sections(model):
                prefix = name + _container_suffix(field.annotation)
                found.append(Section(f"{prefix}.{section.path}" if section.path else prefix, section.model))
    return found


def builtin_methods() -> dict[str, type]:
    """The methods this package ships (plug-ins registered in this process are left out)."""
    from orchestrator.methods import available_methods

    return {name: cls for name, cls in available_methods().items() if cls.__module__.startswith("orchestrator.")}


# --------------------------------------------------------------------------- markdown


def _code(text: str) -> str:
    """Docstring markup (``x``) as Markdown code (`x`), table-safe."""
    return text.replace("``", "`").replace("|", "\\|")


def _section_table(section: Section) -> list[str]:
    title = f"`{section.path}`" if section.path else "top level"
    lines = [f"### {title}", "", _code(summary(section.model)), "",
             "| field | type | default | description |", "|---|---|---|---|"]
    for name, field in section.model.model_fields.items():
        kind = describe_type(field.annotation)
        limits = bounds(field)
        lines.append(f"| `{name}` | {_code(kind)}{' (' + _code(limits) + ')' if limits else ''} | "
                     f"{_code(default_text(field))} | {_code(describe(section.model, name))} |")
    return lines + [""]


def _methods_table() -> list[str]:
    lines = ["## Method parameters (`generations[].method.params`)", "",
             "Each method's own parameters, validated by its `Params` model (unknown names are errors); "
             "`orchestrator methods` prints the same list, plug-ins included.", ""]
    for name, cls in builtin_methods().items():
        lines += [f"### `{name}`", "", _code(cls.summary), ""]
        fields = cls.Params.model_fields
        if not fields:
            lines += ["No parameters.", ""]
            continue
        lines += ["| parameter | type | default |", "|---|---|---|"]
        lines += [f"| `{p}` | {_code(describe_type(f.annotation))}{' (' + _code(bounds(f)) + ')' if bounds(f) else ''} | "
                  f"{_code(default_text(f))} |" for p, f in fields.items()]
        lines.append("")
    return lines


def markdown_reference() -> str:
    """The whole reference (``docs/configuration.md``)."""
    lines = ["# Configuration reference", "",
             "Generated from the pydantic models by `orchestrator/config_reference.py`; do not edit by hand. "
             "`python3 -m orchestrator.config_reference` rewrites this file and the JSON Schemas "
             "(`docs/pipeline.schema.json`, `docs/tune.schema.json`); `orchestrator schema --markdown` prints it. "
             "Unknown fields are errors everywhere. Relative paths are relative to the working directory.", ""]
    for kind, root in FILES.items():
        lines += [f"## {kind.capitalize()} file (`{COMMANDS[kind]} FILE`)", "",
                  f"`{EXAMPLES[kind]}` is the commented example; `docs/{kind}.schema.json` its JSON Schema.", ""]
        for section in sections(root):
            lines += _section_table(section)
    lines += _methods_table()
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------- JSON Schema


def json_schema(kind: str = "pipeline") -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a ``pipeline`` or ``tune`` file, with every property's
    description and the YAML shorthands the loader accepts."""
    root = FILES[kind]
    schema = root.model_json_schema()
    models = {section.model.__name__: section.model for section in sections(root)}
    definitions = schema.get("$defs", {})
    for name, model in models.items():
        target = schema if model is root else definitions[name]
        target["description"] = _plain(summary(model))
        for field_name, prop in target.get("properties", {}).items():
            prop["description"] = _plain(describe(model, field_name))
        if model is MethodSpec:
            target["allOf"] = _method_params_rules()
        if model in SHORTHANDS:
            definitions[name] = {"anyOf": [SHORTHANDS[model], target]}
    return {"$schema": SCHEMA_DIALECT, **schema, "title": f"orchestrator {kind} file"}


def _method_params_rules() -> list[dict[str, Any]]:
    """For each built-in method: if ``name`` is it, ``params`` follows its ``Params`` model (a
    plug-in method's name matches no rule, so its params are left to the loader)."""
    rules = []
    for name, cls in builtin_methods().items():
        params = cls.Params.model_json_schema()
        params.pop("title", None)
        for prop in params.get("properties", {}).values():
            prop.pop("title", None)
        rules.append({"if": {"properties": {"name": {"const": name}}, "required": ["name"]},
                      "then": {"properties": {"params": {"anyOf": [params, {"type": "null"}]}}}})
    return rules


def _plain(text: str) -> str:
    return text.replace("``", "")


def write_reference(folder: str | Path = "docs") -> list[Path]:
    """Write ``configuration.md`` and the two schemas into ``folder``; the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "configuration.md"]
    written[0].write_text(markdown_reference(), encoding="utf-8")
    for kind in FILES:
        path = folder / f"{kind}.schema.json"
        path.write_text(schema_text(kind), encoding="utf-8")
        written.append(path)
    return written


def schema_text(kind: str) -> str:
    """The JSON Schema as the file holds it (indented, key order kept, newline at the end)."""
    return json.dumps(json_schema(kind), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # pragma: no cover
    for path in write_reference(sys.argv[1] if len(sys.argv) > 1 else "docs"):
        print(f"wrote {path}")
