"""Adapter kinds by name, so a checkpoint can describe any adapter and rebuild it without knowing
which method made it.

An adapter kind is an ``nn.Module`` class registered with ``@register_adapter`` under its class
attribute ``kind``. It describes one instance with ``to_spec()`` (a JSON-able dict of what its
constructor needs: shapes and flags, never weights) and builds a fresh instance of the same
structure with the classmethod ``from_spec(spec)``; the weights then come from the state dict.
A saved spec is ``{"kind": <kind>, **to_spec()}`` (``adapter_spec``); ``build_adapter`` reverses it.
Wrappers (``EmbeddingMap``) nest the spec of the module they wrap.

Adapters live in ``CompatibleModel.adapters`` under slot names; the two the comparison rules
know (``orchestrator.comparison``) are here, so that methods, storage and the pipeline share them:

- ``BACKWARD_ADAPTER`` ("backward"): B, new → old space; queries of the generation are mapped by it
  to search an ancestor's gallery (λ-orthogonality §2.10).
- ``FORWARD_ADAPTER`` ("forward_map"): F, the parent's space → this generation's; a parent's gallery
  is upgraded by it without new-model inference (λ-orthogonality §2.5, FCT). "forward" itself
  cannot be a key of an ``nn.ModuleDict``, whose ``forward`` method it would shadow.

Plug-in methods register their own adapter kinds the same way; a process that loads such a
checkpoint must have imported the plug-in's module (``ORCHESTRATOR_PLUGINS``: loading a checkpoint
looks its method up first, which imports the plug-ins).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from torch import nn

BACKWARD_ADAPTER = "backward"
FORWARD_ADAPTER = "forward_map"

_ADAPTERS: dict[str, type[nn.Module]] = {}

AdapterClass = TypeVar("AdapterClass", bound=type)


def register_adapter(cls: AdapterClass) -> AdapterClass:
    """Class decorator adding an adapter kind under its ``kind``; the class must be an ``nn.Module``
    with ``to_spec()`` and a classmethod ``from_spec(spec)``. A second class with the same kind is
    an error."""
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{cls.__qualname__} must set a string class attribute 'kind'")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"adapter kind {kind!r}: {cls.__qualname__} is not an nn.Module")
    for method in ("to_spec", "from_spec"):
        if not callable(getattr(cls, method, None)):
            raise ValueError(f"adapter kind {kind!r}: {cls.__qualname__} has no {method}()")
    existing = _ADAPTERS.get(kind)
    if existing is not None and existing is not cls:
        raise ValueError(f"adapter kind {kind!r} is already registered by {existing.__module__}.{existing.__qualname__}")
    _ADAPTERS[kind] = cls
    return cls


def adapter_class(kind: str) -> type[nn.Module]:
    """The class registered under ``kind``; ValueError listing the known kinds otherwise."""
    try:
        return _ADAPTERS[kind]
    except (KeyError, TypeError):
        raise ValueError(f"unknown adapter kind {kind!r}; known kinds: {', '.join(sorted(_ADAPTERS))} (a plug-in's "
                         "kinds register when its module is imported)") from None


def available_adapters() -> dict[str, type[nn.Module]]:
    """Every registered adapter kind, sorted by name."""
    return dict(sorted(_ADAPTERS.items()))


def adapter_spec(module: nn.Module) -> dict[str, Any]:
    """``{"kind": ..., **module.to_spec()}``; ValueError for a module whose class is not a registered kind."""
    kind = getattr(type(module), "kind", None)
    if not isinstance(kind, str) or _ADAPTERS.get(kind) is not type(module):
        raise ValueError(f"{type(module).__qualname__} is not a registered adapter kind "
                         "(orchestrator.models.adapters.register_adapter), so it cannot be described")
    spec = module.to_spec()
    if "kind" in spec:
        raise ValueError(f"adapter kind {kind!r}: to_spec() must not set 'kind', got {spec!r}")
    return {"kind": kind, **spec}


def build_adapter(spec: Mapping[str, Any]) -> nn.Module:
    """A fresh adapter of the structure ``spec`` (``adapter_spec``) describes, in training mode
    with its initial weights (load the saved state dict into it)."""
    if not isinstance(spec, Mapping) or "kind" not in spec:
        raise ValueError(f"an adapter spec must be a mapping with a 'kind', got {spec!r}")
    cls = adapter_class(spec["kind"])
    module = cls.from_spec({key: value for key, value in spec.items() if key != "kind"})
    if type(module) is not cls:
        raise ValueError(f"adapter kind {spec['kind']!r}: from_spec returned {type(module).__qualname__}, "
                         f"not {cls.__qualname__}")
    return module
