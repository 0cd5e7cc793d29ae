"""The embedding spaces (their distances and coordinates: ``orchestrator.geometry.geometry.Geometry``)."""

from __future__ import annotations

from enum import Enum


class Space(str, Enum):
    """Where embeddings live; the value is the string used in configs."""

    EUCLIDEAN = "euclidean"
    COSINE = "cosine"
    LORENTZ = "lorentz"
    POINCARE = "poincare"

    @classmethod
    def parse(cls, space: Space | str) -> Space:
        """Return the member for a ``Space`` or its string value; ValueError naming a bad value."""
        try:
            return cls(space)
        except ValueError:
            valid = [member.value for member in cls]
            raise ValueError(f"space must be one of {valid}, got {space!r}") from None

    @property
    def hyperbolic(self) -> bool:
        """True for the hyperbolic spaces (lorentz, poincare), which have a curvature."""
        return self in (Space.LORENTZ, Space.POINCARE)
