"""Name → method class, so YAML, Tune and the CLI all say ``method: {name: ..., ...}``.

Methods outside this package (plug-ins) register themselves with ``@register_method`` when their
module is imported. A process that only *looks a method up by name* (a Ray Train worker, a CLI
run) must import that module first: every lookup also imports the modules named in the
``ORCHESTRATOR_PLUGINS`` environment variable (comma-separated importable module names, e.g.
``ORCHESTRATOR_PLUGINS=cosine_anchor``). Give Ray workers the variable and the code through the
runtime environment, e.g. ``ray.init(runtime_env={"py_modules": [module],
"env_vars": {"ORCHESTRATOR_PLUGINS": "cosine_anchor"}})``; see ``examples/custom_method``.

Validation reads a method's description (``method_description``: name, ``Params``, traits), which
for a built-in method comes from ``orchestrator.methods.descriptions`` without importing torch;
``method_class`` imports the method's module (and torch) to train with it.
"""
from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any, Mapping

from orchestrator.methods import descriptions, posthoc_descriptions
from orchestrator.methods.descriptions import MethodDescription

if TYPE_CHECKING:
    from orchestrator.methods.base import CompatibilityMethod

_METHODS: dict[str, type[CompatibilityMethod]] = {}
#: The built-in methods: name -> (description, the module whose import registers the method).
BUILTIN = {**descriptions.BUILTIN, **posthoc_descriptions.POSTHOC}


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
    if name in BUILTIN and not issubclass(cls, BUILTIN[name][0]):
        raise ValueError(f"method name {name!r} is the built-in method of {BUILTIN[name][1]}")
    _METHODS[name] = cls
    return cls


def method_class(name: str) -> type[CompatibilityMethod]:
    """The class registered under ``name`` (importing its module); ValueError listing the known
    names otherwise."""
    if name in BUILTIN and name not in _METHODS:
        importlib.import_module(BUILTIN[name][1])  # registers it
    if name not in _METHODS:
        _load_plugins()
    try:
        return _METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(available_methods())}") from None


def method_description(name: str) -> type[MethodDescription]:
    """The name, ``Params`` and traits of the method ``name``: a built-in one's without importing
    torch, a plug-in's class (``method_class``)."""
    if name in BUILTIN:
        return BUILTIN[name][0]
    return method_class(name)


def create_method(name: str, params: Mapping[str, Any] | None = None) -> CompatibilityMethod:
    """Instantiate the method ``name`` with validated ``params`` (papers' defaults for missing ones)."""
    return method_class(name)(params)


def available_methods() -> dict[str, type[MethodDescription]]:
    """Every method's description (``method_description``), sorted by name: the built-in ones
    (``orchestrator.methods.descriptions``) and the registered plug-ins' classes."""
    _load_plugins()
    return {name: method_description(name) for name in sorted({*BUILTIN, *_METHODS})}


PLUGINS_ENV = "ORCHESTRATOR_PLUGINS"


def _load_plugins() -> None:
    # Importing the plug-in modules named in ORCHESTRATOR_PLUGINS registers their methods (once:
    # imports are cached in sys.modules, so a repeated lookup costs a dict access per module).
    for module in os.environ.get(PLUGINS_ENV, "").split(","):
        module = module.strip()
        if module:
            try:
                importlib.import_module(module)
            except ImportError as error:
                raise ImportError(f"{PLUGINS_ENV} names the module {module!r}, which cannot be imported "
                                  f"(is it on the Python path of this process?): {error}") from error
