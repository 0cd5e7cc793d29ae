"""Package namespaces whose names are imported on first use (PEP 562).

A Ray worker imports the module of every task or actor it runs, with each package on the way.
Packages whose ``__init__`` imported all their modules made a task that only reads Parquet
import torch and timm (about 4 s of CPU per worker process on 2 cores). Such packages declare
their names here instead: ``from orchestrator.data import load_digits`` imports
``orchestrator.data.sources`` when it runs, and only then.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, modules: Mapping[str, Sequence[str]]) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """(``__getattr__``, ``__dir__``, ``__all__``) for ``package``: ``modules`` maps each submodule
    (relative name) to the names it exports; a name is imported from it on first access and then
    kept in the package's namespace."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(where) | set(vars(sys.modules[package])))

    return __getattr__, __dir__, sorted(where)
