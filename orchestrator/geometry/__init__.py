"""Geometry layer: Lorentz and Poincaré hyperbolic models, d-Simplex prototypes, and ``Geometry``
(one space with its curvature: retrieval distance, index coordinates, uncertainty)."""

from orchestrator.lazy_exports import lazy_exports

# Imported on first use: ``Space`` (a plain enum) is read by the validation of pipeline files,
# which imports no torch; ``Geometry`` and the models' modules need it.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "geometry": ["FLAT_CURVATURE", "Geometry"],
    "spaces": ["Space"],
})
