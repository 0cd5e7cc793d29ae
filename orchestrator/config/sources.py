"""A file's data source and its loader options, checked against the loader's own signature
(``orchestrator.data.registry``): unknown, reserved and missing options, and the split names."""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from orchestrator.config.problems import problem, suggest
from orchestrator.data.registry import SOURCE_NAMES, SPLITS, STREAMED_SOURCES, loader_parameters

_RESERVED_OPTIONS = {"split": "train_split / eval_split / gallery.split", "image_size": "data.image_size", "variant": "source"}


def check_options(source: str, options: Mapping[str, Any], where: tuple) -> list[dict[str, Any]]:
    """Problems with a source's loader options: unknown keys, reserved keys, missing required ones."""
    parameters = loader_parameters(source)
    if parameters is None:  # a source this module has no signature for: the loader checks its options
        return []
    accepted = [name for name in parameters if name not in _RESERVED_OPTIONS]
    problems = []
    for key, value in options.items():
        if key in _RESERVED_OPTIONS:
            problems.append(problem((*where, key), f"set by {_RESERVED_OPTIONS[key]}, not as a loader option", value))
        elif key not in parameters:
            problems.append(
                problem((*where, key), f"unknown option of source {source!r}{suggest(key, accepted)}; accepted: "
                        f"{', '.join(accepted)}", value)
            )
    return problems


def missing_options(source: str, options: Mapping[str, Any]) -> list[str]:
    """The required loader options of ``source`` that ``options`` does not give."""
    parameters = loader_parameters(source) or {}
    return [
        name for name, p in parameters.items()
        if p.default is inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD and name not in _RESERVED_OPTIONS
        and name not in options
    ]


def check_split(source: str, split: str, split_options: Mapping[str, Any], where: tuple) -> list[dict[str, Any]]:
    """A split the source does not have, or one of a loader without a split argument that has no options."""
    parameters = loader_parameters(source)
    if parameters is None:
        return []
    if "split" in parameters:
        known = SPLITS.get(source)
        if known is not None and split not in known:
            return [problem(where, f"source {source!r} has the splits {', '.join(known)}", split)]
        return []
    if split not in split_options:
        return [problem(where, f"source {source!r} has no split argument: give this split's loader options "
                                f"(e.g. its root) under data.split_options.{split}", split)]
    return []


def source_name(source: str, streamed: bool = False) -> str:
    """``source`` if it is a known in-memory source (or, with ``streamed``, a streamed one); else ValueError."""
    if streamed and source in STREAMED_SOURCES:
        return source
    if source not in SOURCE_NAMES:
        raise ValueError(f"unknown data source{suggest(source, SOURCE_NAMES)}; known: {', '.join(SOURCE_NAMES)}")
    return source
