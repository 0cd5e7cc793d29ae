"""Compatibility methods, one file each behind the protocol in ``base.py``; importing this
package registers all built-in methods with the registry."""
from orchestrator.methods import (  # noqa: F401  (importing registers each method)
    advbct,
    bct,
    binary_hyperbolic,
    dsimplex,
    fct,
    hbct,
    hoc,
    hot_refresh,
    independent,
    l2,
    lambda_orth,
    lce,
    ndpp,
    odpp,
    unibct,
)
from orchestrator.methods.base import CompatibilityMethod, MethodParams, TrainContext, embed_dataset
from orchestrator.methods.registry import available_methods, create_method, method_class, register_method

__all__ = [
    "CompatibilityMethod",
    "MethodParams",
    "TrainContext",
    "embed_dataset",
    "available_methods",
    "create_method",
    "method_class",
    "register_method",
]
