"""The unaligned models an update is measured against and aligned to, per method: φ_* (the
reference, ``reference_method``) and φ_o's method (``parent_method``). A method may name its own
(``CompatibilityMethod.own_reference`` / ``own_parent``); the rule for the rest names a concrete
method, so it lives here, beside the registry, and not in the methods' base class."""
from __future__ import annotations

from typing import Any

from orchestrator.geometry.spaces import Space
from orchestrator.methods.base import CompatibilityMethod
from orchestrator.methods.registry import create_method


def reference_method(method: CompatibilityMethod) -> CompatibilityMethod:
    """The unaligned model φ_* of ``method``'s geometry that P_com / P_up normalise by (hbct.md §11):
    the method's own (``own_reference``: a parent-free method trained with no parent), else a
    parent-aligned method's: ``independent`` in the same space (in the Lorentz space with the same
    ``curv`` and ``clip``, else the two models share no distance)."""
    own = method.own_reference()
    if own is not None:
        return own
    geometry: dict[str, Any] = {"space": method.space.value}
    if method.space is Space.LORENTZ:
        geometry.update({k: getattr(method.params, k) for k in ("curv", "clip") if hasattr(method.params, k)})
    return create_method("independent", geometry)


def parent_method(method: CompatibilityMethod) -> CompatibilityMethod:
    """A method that trains a first (old) generation ``method`` can align to (φ_o): the method's
    own (``own_parent``: HBCT lowers the clip, ζ_o = ζ_n − 0.2), else its reference."""
    own = method.own_parent()
    return own if own is not None else reference_method(method)
