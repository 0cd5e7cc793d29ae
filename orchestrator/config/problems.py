"""Problems of a configuration file: the error, the problem records the models' validators raise,
and the helpers that name a field and suggest a spelling.

A validator that finds problems builds each with ``problem(loc, msg, value)`` (``loc`` relative to
the model it validates) and raises them together with ``raise_problems``; ``orchestrator.config.
yaml_errors`` expands them so that every problem is one line naming the file, its own field path,
the bad value and its line. Every model derives from ``StrictModel`` (unknown fields are errors).
Tune files (``orchestrator.tuning.config``) use the same machinery.
"""
from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

from orchestrator.errors import UsageError

_NO_INPUT = object()  # a problem that shows no "(got ...)" value


class PipelineConfigError(UsageError, ValueError):
    """A pipeline file that cannot be used; ``str(error)`` is one line per problem.

    file:     the path as given to ``load_pipeline``.
    problems: the lines without the file prefix (``"<field path>: <message>"``).
    """

    def __init__(self, file: str, problems: list[str]):
        self.file = file
        self.problems = problems
        super().__init__("\n".join(f"{file}: {problem}" for problem in problems))


def problem(loc: tuple, msg: str, value: Any = _NO_INPUT) -> dict[str, Any]:
    """One problem below the location of the validator that reports it (``loc`` is relative)."""
    problem = {"loc": tuple(loc), "msg": msg, "type": "config_problem"}
    if value is not _NO_INPUT:
        problem["input"] = value
    return problem


def raise_problems(problems: list[dict[str, Any]]) -> None:
    """Raise the problems as one pydantic error whose context carries them with their own locations.

    pydantic gives a validator's error the validator's location only; ``load_pipeline`` expands the
    ``problems`` in the context so that each names its own field. For direct ``model_validate``
    calls the summary lists them too.
    """
    if problems:
        summary = "; ".join(f"{field_path(p['loc']) or '(here)'}: {with_value(p['msg'], p)}" for p in problems)
        raise PydanticCustomError("config_problems", "{summary}", {"summary": summary, "problems": problems})


def problems_from(error: ValidationError, model: type[BaseModel]) -> list[dict[str, Any]]:
    """A nested model's validation errors as problems (with the allowed names for unknown fields)."""
    problems = []
    for err in error.errors(include_url=False):
        problem = {key: err[key] for key in ("loc", "msg", "type", "input") if key in err}
        if err["type"] == "extra_forbidden":
            problem["allowed"] = fields_at(model, err["loc"][:-1])
        problems.append(problem)
    return problems


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def fields_at(model: Any, loc: tuple) -> list[str] | None:
    """Field names of the pydantic model reached from ``model`` along ``loc``, if any."""
    tp: Any = model
    for element in loc:
        tp = unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if isinstance(element, str) and element in tp.model_fields:
                tp = tp.model_fields[element].annotation
            continue  # an element pydantic adds (e.g. ``ids`` of a list selection): stay on this model
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (list, tuple) and args:
            tp = args[0]
        elif origin is dict and len(args) == 2:
            tp = args[1]
        else:
            return None
    tp = unwrap(tp)
    return list(tp.model_fields) if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def unwrap(tp: Any) -> Any:
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def field_path(loc: Iterable[Any]) -> str:
    """('generations', 1, 'method', 'params', 'lam') → 'generations[1].method.params.lam'."""
    out = ""
    for element in loc:
        if isinstance(element, int):
            out += f"[{element}]"
        else:
            out += f".{element}" if out else str(element)
    return out


def with_value(msg: str, err: Mapping[str, Any]) -> str:
    """``msg (got <input>)`` when the error carries the offending input."""
    if "input" not in err or err.get("type") == "missing":
        return msg
    value, shown = err["input"], _show(err["input"])
    # a string the message already quotes is not repeated (numbers always are: "> 0 (got 0)")
    if isinstance(value, str) and (shown in msg or repr(value) in msg):
        return msg
    return f"{msg} (got {shown})"


def _show(value: Any, limit: int = 80) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def suggest(word: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(candidates), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""
