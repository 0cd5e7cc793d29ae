"""Geometry layer: Lorentz and Poincaré hyperbolic models, d-Simplex prototypes, and ``Geometry``
(one space with its curvature: retrieval distance, index coordinates, uncertainty)."""

from orchestrator.geometry import lorentz, poincare, simplex, spaces
from orchestrator.geometry.geometry import FLAT_CURVATURE, Geometry
from orchestrator.geometry.spaces import Space

__all__ = ["FLAT_CURVATURE", "Geometry", "Space", "lorentz", "poincare", "simplex", "spaces"]
