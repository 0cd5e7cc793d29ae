"""Name → method class, so YAML, Tune and the CLI all say ``method: {name: ..., ...}``."""
from __future__ import annotations

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


def _load_builtin_methods() -> None:
    # Importing the package registers every built-in method (each module decorates its class).
    import orchestrator.methods  # noqa: F401
