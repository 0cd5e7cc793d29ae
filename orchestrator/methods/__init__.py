"""Compatibility methods, one file each behind the protocol in ``base.py``; their hyperparameters
and traits, without torch, in ``descriptions.py``. Names are imported on first use
(``orchestrator.lazy_exports``), so reading ``orchestrator.methods.descriptions`` or the registry
imports no torch; the registry imports a method's module, which registers it, when it is needed."""
from orchestrator.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "base": ["CompatibilityMethod", "TrainContext", "embed_dataset"],
    "descriptions": ["MethodDescription", "MethodParams"],
    "loading": ["load_generation"],
    "references": ["parent_method", "reference_method"],
    "registry": ["available_methods", "create_method", "method_class", "method_description", "register_method"],
})
