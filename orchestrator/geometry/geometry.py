"""One embedding space with its curvature: every per-space rule the other layers need, in one place.

``Geometry(space, curv)`` knows, for its space,

* the retrieval distance between embeddings (``pairwise_distance``; smaller is closer);
* the coordinates an index stores or quantises (``coordinates``) and the exact distance between
  such coordinates (``coordinate_distance``);
* the hyperbolic uncertainty of an embedding (``uncertainty``);
* the curvature records carry (``curv``): the given one for the hyperbolic spaces, ``1.0`` for the
  flat ones (euclidean, cosine), whose models report 0 and where the value is never used;
* whether points are valid (``check_points``).

Every method takes torch tensors (float or double, any device; differentiable, also in a tensor
``curv``) and returns tensors. numpy arrays are accepted too: they are computed as float64 tensors
and returned as float64 arrays, so the numpy callers (the indexes) share the torch formulas.

The geometry layer imports no Ray, index or pipeline module.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Literal

import numpy as np
import torch
import torch.nn.functional as F

from orchestrator.geometry import lorentz, poincare
from orchestrator.geometry._numerics import Curvature, check_curv
from orchestrator.geometry.spaces import Space

#: The curvature recorded for the flat spaces (which ignore it).
FLAT_CURVATURE = 1.0
#: Which model of hyperbolic space ``coordinates`` returns for both hyperbolic spaces.
HyperbolicModel = Literal["poincare", "lorentz"]
_HYPERBOLIC_MODELS = ("poincare", "lorentz")


def _as_float64_tensor(value: Any) -> Any:
    """A numpy array as a float64 tensor (sharing memory where it already is contiguous float64)."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value, dtype=np.float64))
    return value


def _accepts_numpy(method: Callable[..., torch.Tensor]) -> Callable[..., Any]:
    """Run ``method`` on float64 tensors when any argument is a numpy array; return a float64 array then."""

    @functools.wraps(method)
    def wrapper(self: Geometry, *args: Any, **kwargs: Any) -> Any:
        if not any(isinstance(a, np.ndarray) for a in (*args, *kwargs.values())):
            return method(self, *args, **kwargs)
        tensors = [_as_float64_tensor(a) for a in args]
        return method(self, *tensors, **{k: _as_float64_tensor(v) for k, v in kwargs.items()}).numpy()

    return wrapper


def _check_model(hyperbolic_model: str) -> None:
    if hyperbolic_model not in _HYPERBOLIC_MODELS:
        raise ValueError(f"hyperbolic_model must be one of {list(_HYPERBOLIC_MODELS)}, got {hyperbolic_model!r}")


@dataclass(frozen=True, init=False)
class Geometry:
    """An embedding space and its curvature magnitude ``curv`` (curvature ``-curv``; module docstring).

    ``curv`` is canonical: ``FLAT_CURVATURE`` (1.0) for euclidean and cosine whatever is given; for
    lorentz and poincare the given positive float (Python or numpy number, stored as ``float``) or
    0-d tensor (learnable curvature), checked (ValueError naming the value).
    """

    space: Space
    curv: Curvature

    def __init__(self, space: Space | str, curv: Curvature | numbers.Real = FLAT_CURVATURE):
        space = Space.parse(space)
        if not space.hyperbolic:
            curv = FLAT_CURVATURE
        elif isinstance(curv, numbers.Real) and not isinstance(curv, bool):
            curv = float(curv)
        check_curv(curv)
        object.__setattr__(self, "space", space)
        object.__setattr__(self, "curv", curv)

    @property
    def hyperbolic(self) -> bool:
        """True for lorentz and poincare."""
        return self.space.hyperbolic

    # -- distances between embeddings -----------------------------------------------------------
    @_accepts_numpy
    def pairwise_distance(self, queries: torch.Tensor, gallery: torch.Tensor) -> torch.Tensor:
        """Distances between every query and every gallery item: ``(Nq, D), (Ng, D) -> (Nq, Ng)``.

        * euclidean: L2 distance ``||q - g||``;
        * cosine: ``1 - cos(q, g)``; zero vectors are normalised to 0 (``F.normalize``), so their
          cosine is 0 and their distance 1 to everything;
        * lorentz: geodesic ``(1/sqrt K) arccosh(-K<q,g>_L)`` (HBCT eq. 3), ``D = d+1`` full points,
          time first (``lorentz.pairwise_distance``);
        * poincare: geodesic ``(1/sqrt K) arccosh(1 + 2K||q-g||^2 / ((1-K||q||^2)(1-K||g||^2)))``
          (binary_hyperbolic.md §2.1, eq. 20) in the ball of radius ``1/sqrt K`` (``poincare.pairwise_distance``).
        """
        if queries.dim() != 2 or gallery.dim() != 2 or queries.shape[1] != gallery.shape[1]:
            raise ValueError(
                "queries and gallery must be (Nq, D) and (Ng, D) with the same D, got "
                f"queries {tuple(queries.shape)} and gallery {tuple(gallery.shape)}"
            )
        if self.space is Space.EUCLIDEAN:
            return torch.cdist(queries, gallery)
        if self.space is Space.COSINE:
            return 1.0 - F.normalize(queries, dim=1) @ F.normalize(gallery, dim=1).T
        if self.space is Space.LORENTZ:
            return lorentz.pairwise_distance(queries, gallery, self.curv)
        return poincare.pairwise_distance(queries, gallery, self.curv)

    # -- index coordinates ----------------------------------------------------------------------
    @_accepts_numpy
    def coordinates(self, x: torch.Tensor, hyperbolic_model: HyperbolicModel = "poincare") -> torch.Tensor:
        """The coordinates an index works on: ``(..., D) -> (..., d')``.

        * euclidean: ``x`` as it is (the paper binarises its Euclidean baseline unchanged, §4.2);
        * cosine: ``x / max(||x||, 1e-12)`` (``F.normalize``; zero vectors stay zero);
        * hyperbolic, ``hyperbolic_model="poincare"``: points of the ball of radius ``1/sqrt K``
          (bit-planes are defined on the ball, binary_hyperbolic.md Remark 3.3): a poincare point
          as it is, a lorentz point ``x_s / (1 + sqrt(K) x_t)`` (eq. 12, ``lorentz.to_poincare``);
        * hyperbolic, ``hyperbolic_model="lorentz"``: full hyperboloid points ``[x_t, x_s]``, time
          first, with ``x_t = sqrt(1/K + ||x_s||^2)`` recomputed (HBCT eq. 2): a lorentz point from
          its space part, a poincare point by ``x_s = 2p / (1 - K||p||^2)`` (``lorentz.from_poincare``).

        The maps are isometries, so ``coordinate_distance`` on the coordinates equals
        ``pairwise_distance`` on the embeddings.
        """
        _check_model(hyperbolic_model)
        if self.space is Space.COSINE:
            return F.normalize(x, dim=-1)
        if self.space is Space.LORENTZ:
            return lorentz.to_poincare(x, self.curv) if hyperbolic_model == "poincare" else \
                lorentz.from_space(x[..., 1:], self.curv)
        if self.space is Space.POINCARE and hyperbolic_model == "lorentz":
            return lorentz.from_poincare(x, self.curv)
        return x

    @_accepts_numpy
    def coordinate_distance(self, x: torch.Tensor, y: torch.Tensor,
                            hyperbolic_model: HyperbolicModel = "poincare") -> torch.Tensor:
        """Retrieval distance between coordinates (``coordinates``' output), elementwise with
        broadcasting: ``(..., d'), (..., d') -> (...)``.

        L2 for euclidean; ``1 - <x, y>`` for cosine (the coordinates are normalised); for the
        hyperbolic spaces the geodesic distance of the chosen model: ``poincare.distance``
        (binary_hyperbolic.md §2.1) or ``lorentz.distance`` (HBCT eq. 3), equal by the isometry.
        """
        _check_model(hyperbolic_model)
        if self.space is Space.EUCLIDEAN:
            return torch.sqrt(((x - y) ** 2).sum(dim=-1))
        if self.space is Space.COSINE:
            return 1.0 - (x * y).sum(dim=-1)
        if hyperbolic_model == "poincare":
            return poincare.distance(x, y, self.curv)
        return lorentz.distance(x, y, self.curv)

    # -- uncertainty ----------------------------------------------------------------------------
    @_accepts_numpy
    def uncertainty(self, x: torch.Tensor) -> torch.Tensor:
        """Per-embedding uncertainty ``(..., D) -> (...)``: for lorentz ``1 - ||x_s|| / x_t`` in [0, 1]
        (HBCT eq. 10, ``lorentz.uncertainty``); NaN for the other spaces, which define none."""
        if self.space is Space.LORENTZ:
            return lorentz.uncertainty(x, self.curv)
        return torch.full(x.shape[:-1], math.nan, dtype=x.dtype, device=x.device)

    # -- validation -----------------------------------------------------------------------------
    def check_points(self, embeddings: torch.Tensor | np.ndarray) -> None:
        """ValueError unless ``(N, D)`` rows are points of the space: ``D >= 1``; lorentz ``D = d+1 >= 2``
        (time first); poincare rows strictly inside the ball of radius ``1/sqrt K``."""
        n, dim = embeddings.shape
        if self.space is Space.LORENTZ and dim < 2:
            raise ValueError(f"lorentz embeddings must be (N, d+1) with d >= 1 (time first), got dim {dim}")
        if dim < 1:
            raise ValueError(f"embeddings must have at least one column, got shape {tuple(embeddings.shape)}")
        if self.space is Space.POINCARE and n:
            radius_sq = float((embeddings * embeddings).sum(axis=1).max())
            curv = float(self.curv)
            if radius_sq * curv >= 1.0:
                raise ValueError(
                    "poincare embeddings must lie inside the ball of radius 1/sqrt(curv) = "
                    f"{1 / math.sqrt(curv):.6g}, max norm is {math.sqrt(radius_sq):.6g}"
                )
