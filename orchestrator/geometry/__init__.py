"""Geometry layer: Lorentz and Poincaré hyperbolic models, d-Simplex prototypes, retrieval distances."""

from orchestrator.geometry import lorentz, poincare, simplex, spaces
from orchestrator.geometry.spaces import Space

__all__ = ["Space", "lorentz", "poincare", "simplex", "spaces"]
