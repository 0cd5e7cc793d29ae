"""Reading a YAML configuration file and turning every problem into one line.

``read_yaml_mapping`` reads a file within the bounds of ``orchestrator.limits``
(``orchestrator.bounded_yaml``: ``yaml.safe_load``'s types) and reports unreadable files, files
past a bound, syntax errors and duplicate keys; ``validate_yaml_mapping`` validates the mapping
with a pydantic model and names, for every problem, the field path, the bad value and its line::

    pipelines/x.yaml: generations[1].method.params.lam: Input should be greater than or equal to 0 (got -1) [line 23]
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from orchestrator import bounded_yaml
from orchestrator.bounded_yaml import YAMLLimitError
from orchestrator.config.problems import PipelineConfigError, field_path, fields_at, suggest, with_value


def read_yaml_mapping(path: str | Path, expected: str,
                      error: type[PipelineConfigError] = PipelineConfigError) -> tuple[str, dict, yaml.Node]:
    """``(file, data, node tree)`` of a YAML file whose top level must be a mapping (``expected``
    describes its fields for the error). Read within the bounds of ``orchestrator.limits`` by
    ``orchestrator.bounded_yaml`` (``yaml.safe_load``'s types); the node graph gives line numbers.
    Unreadable files, files past a bound, syntax errors and duplicate keys raise ``error``."""
    file = str(path)
    try:
        text = bounded_yaml.read_text(path)
        raw, root = bounded_yaml.load(text)
    except YAMLLimitError as err:
        raise error(file, [_limit_problem(err)]) from None
    except yaml.YAMLError as err:
        raise error(file, [_yaml_error(err)]) from None
    except FileNotFoundError:
        raise error(file, [f"file not found (looked for {Path(path).resolve()})"]) from None
    except IsADirectoryError:
        raise error(file, ["is a directory, not a YAML file"]) from None
    except UnicodeDecodeError as err:
        raise error(file, [f"not UTF-8 text ({err.reason} at byte {err.start})"]) from None
    except OSError as err:
        raise error(file, [f"cannot read the file ({err.strerror or err})"]) from None
    problems = _duplicate_keys(root, ())
    if problems:
        raise error(file, problems)
    if not isinstance(raw, dict):
        kind = "an empty file" if raw is None else f"a {type(raw).__name__}"
        raise error(file, [f"(top level): expected a mapping of {expected}, got {kind}"])
    return file, raw, root


def validate_yaml_mapping(model: type[BaseModel], file: str, raw: dict, root: yaml.Node | None,
                          overridden: list[tuple] | None = None, context: Mapping[str, Any] | None = None,
                          error: type[PipelineConfigError] = PipelineConfigError) -> Any:
    """``model.model_validate(raw)`` (with the validation ``context``), every problem turned into
    one line naming the field path, the bad value and its line in ``file`` (``error``)."""
    try:
        return model.model_validate(raw, context=context)
    except ValidationError as err:
        raise error(file, _format_errors(err.errors(include_url=False), raw, root, overridden or [], model)) from None


def _limit_problem(err: YAMLLimitError) -> str:
    """A file past a bound of ``orchestrator.limits``: the field path, the bound, the value, the line."""
    line = f" [line {err.line}]" if err.line is not None else ""
    return f"{field_path(err.loc) or '(file)'}: {err.message} (got {err.value}){line}"


def _yaml_error(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context_mark = getattr(err, "context_mark", None)
    if context and context_mark is not None and mark is not None and context_mark is not mark:
        context += f" started at line {context_mark.line + 1}, column {context_mark.column + 1}"
    return f"{where}YAML syntax error: {problem}" + (f" ({context})" if context else "")


def _duplicate_keys(node: yaml.Node | None, loc: tuple) -> list[str]:
    """A YAML mapping with the same key twice keeps the last value silently: report it."""
    problems = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name is not None and name != "<<":
                if name in seen:
                    problems.append(f"{field_path((*loc, name))}: duplicate key (also at line {seen[name]}; YAML would keep "
                                    f"only the last value) [line {key.start_mark.line + 1}]")
                else:
                    seen[name] = key.start_mark.line + 1
            problems += _duplicate_keys(value, (*loc, name))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            problems += _duplicate_keys(item, (*loc, i))
    return problems


def _format_errors(errors: list[dict[str, Any]], raw: Any, root: yaml.Node | None, overridden: list[tuple],
                   model: type[BaseModel]) -> list[str]:
    lines = []
    for err in errors:
        if err.get("type") == "config_problems":
            nested = [{**p, "loc": (*err["loc"], *p["loc"])} for p in err["ctx"]["problems"]]
            lines += _format_errors(nested, raw, root, overridden, model)
            continue
        loc = _display_loc(tuple(err["loc"]), raw)
        msg = str(err["msg"])
        for prefix in ("Value error, ", "Assertion failed, "):
            if msg.startswith(prefix):
                msg = msg[len(prefix):]
        if err.get("type") == "extra_forbidden":
            allowed = err.get("allowed")
            if allowed is None:
                allowed = fields_at(model, tuple(err["loc"])[:-1])
            msg = f"unknown field{suggest(str(loc[-1]), allowed or [])}" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
        msg = with_value(msg, err)
        if any(loc[: len(o)] == o for o in overridden):
            msg += " [set by override]"
        else:
            line = _line_of(root, loc)
            if line is not None:
                msg += f" [line {line}]"
        lines.append(f"{field_path(loc) or '(top level)'}: {msg}")
    return lines


def _display_loc(loc: tuple, raw: Any) -> tuple:
    """The error location as the user wrote it: elements pydantic adds that are not in the input
    (``ids`` of ``classes: [..]``) are dropped when the next element continues the input path."""
    out: list[Any] = []
    node = raw
    for i, element in enumerate(loc):
        nxt = loc[i + 1] if i + 1 < len(loc) else None
        if isinstance(node, dict) and element in node:
            node = node[element]
        elif isinstance(node, list) and isinstance(element, int) and -len(node) <= element < len(node):
            node = node[element]
        elif isinstance(element, str) and nxt is not None and (
            (isinstance(node, dict) and nxt in node) or (isinstance(node, list) and isinstance(nxt, int))
        ):
            continue
        else:
            node = None
        out.append(element)
    return tuple(out)


def _line_of(root: yaml.Node | None, loc: tuple) -> int | None:
    """1-based line of the deepest YAML node on the path ``loc`` (the key's line for mappings)."""
    node, line = root, None
    for element in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(element)), None)
            key = next((k for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(element)), None)
            if match is None:
                break
            node, line = match, key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(element, int) and 0 <= element < len(node.value):
            node = node.value[element]
            line = node.start_mark.line + 1
        else:
            break
    return line
