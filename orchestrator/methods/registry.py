"""Name → method class, so YAML, Tune and the CLI all say ``method: {name: ..., ...}``.

Methods outside this package (plug-ins) register themselves with ``@register_method`` when their
module is imported. A process that only *looks a method up by name* (a Ray Train worker, a CLI
run) must import that module first: every lookup also imports the modules named in the
``ORCHESTRATOR_PLUGINS`` environment variable (comma-separated importable module names, e.g.
``ORCHESTRATOR_PLUGINS=cosine_anchor``). Give Ray workers the variable and the code through the
runtime environment, e.g. ``ray.init(runtime_env={"py_modules": [module],
"env_vars": {"ORCHESTRATOR_PLUGINS": "cosine_anchor"}})``; see ``examples/custom_method``.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Mapping

from orchestrator.methods.base import CompatibilityMethod

_METHODS: dict[str, type[CompatibilityMethod]] = {}


def register_method(cls: type[CompatibilityMethod]) -> type[CompatibilityMethod]:
    """Class decorator adding a method under its ``name``; a second class with the same name is an error."""
    name = getattr(cls, "name", None)
    if not name or not isinstance(name, str):
        raise ValueError(f"{cls.__qualname__} must set a string class attribute 'name'")
    existing = _METHODS.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(
            f"method name {name!r} is already registered by {existing.__module__}.{existing.__qualname__}"
        )
    _METHODS[name] = cls
    return cls


def method_class(name: str) -> type[CompatibilityMethod]:
    """The class registered under ``name``; ValueError listing the known names otherwise."""
    _load_builtin_methods()
    try:
        return _METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(sorted(_METHODS))}") from None


def create_method(name: str, params: Mapping[str, Any] | None = None) -> CompatibilityMethod:
    """Instantiate the method ``name`` with validated ``params`` (papers' defaults for missing ones)."""
    return method_class(name)(params)


def available_methods() -> dict[str, type[CompatibilityMethod]]:
    """All registered methods, sorted by name."""
    _load_builtin_methods()
    return dict(sorted(_METHODS.items()))


PLUGINS_ENV = "ORCHESTRATOR_PLUGINS"


def _load_builtin_methods() -> None:
    # Importing the package registers every built-in method (each module decorates its class);
    # importing the plug-in modules named in ORCHESTRATOR_PLUGINS registers theirs (once: imports
    # are cached in sys.modules, so a repeated lookup costs a dict access per module).
    import orchestrator.methods  # noqa: F401

    for module in os.environ.get(PLUGINS_ENV, "").split(","):
        module = module.strip()
        if module:
            try:
                importlib.import_module(module)
            except ImportError as error:
                raise ImportError(f"{PLUGINS_ENV} names the module {module!r}, which cannot be imported "
                                  f"(is it on the Python path of this process?): {error}") from error
