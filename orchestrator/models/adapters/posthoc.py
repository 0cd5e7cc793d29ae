"""Adapter kinds of the post-hoc maps (``orchestrator.methods.posthoc``): maps fitted between two
encoders nobody trained to be compatible (Drift-Adapter, Vejendla, EMNLP 2025; spherical
interpolation, miccunifi/SLERP_backward_compatibility).

- ``ChartMap``: a map g between two embedding spaces applied in their flat charts: the input is
  taken to the source space's chart (``to_chart``), mapped, and the result placed in the target
  space (``from_chart``). A post-hoc generation stores it as its ``backward`` adapter, so the
  comparison rules' adapter path, the gate and serving apply it as any other backward map.
- ``LowRankAffineAdapter``: g(x) = U (Vᵀ x) + b, rank r.
- ``ResidualMLPAdapter``: g(x) = R x + W₂ relu(W₁ x + b₁) + b₂ around a fixed linear map R.
- ``QueryInterpolation``: slerp(align(x), y; t), the aligned new query interpolated on the unit
  sphere with the parent's embedding y of the same query (``spherical_interpolation``); it takes
  two inputs, so the comparison rules hand it the parent's query embeddings.

The orthogonal Procrustes map is an ``AffineAdapter`` without bias holding the fitted matrix.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.geometry import lorentz
from orchestrator.geometry.spaces import Space
from orchestrator.models.adapters.registry import adapter_spec, build_adapter, register_adapter

#: The spaces a post-hoc map can read and write (the Poincaré ball has no chart here).
CHART_SPACES = (Space.COSINE, Space.EUCLIDEAN, Space.LORENTZ)


def chart_dim(space: Space | str, embedding_dim: int) -> int:
    """Coordinates of the chart of a space whose embeddings have ``embedding_dim`` (Lorentz: d + 1 → d)."""
    return embedding_dim - 1 if Space.parse(space) is Space.LORENTZ else embedding_dim


def to_chart(x: torch.Tensor, space: Space | str, curv: float) -> torch.Tensor:
    """Embeddings (N, D) of ``space`` → their chart (N, D'), where the maps are fitted and applied:

    cosine     x / ‖x‖ (the unit sphere: cosine ranks directions only)
    euclidean  x
    lorentz    log₀(x) = asinh(√K‖x_s‖) x_s / (√K‖x_s‖), the tangent space at the origin (D' = D − 1)
    """
    space = Space.parse(space)
    if space is Space.COSINE:
        return F.normalize(x, dim=-1)
    if space is Space.EUCLIDEAN:
        return x
    if space is Space.LORENTZ:
        return lorentz.logmap0(x, curv)
    raise ValueError(f"post-hoc maps read and write {', '.join(s.value for s in CHART_SPACES)} embeddings, "
                     f"not {space.value}")


def from_chart(y: torch.Tensor, space: Space | str, curv: float) -> torch.Tensor:
    """Chart coordinates (N, D') → embeddings of ``space`` (N, D): lorentz exp₀(y) (D = D' + 1),
    the flat spaces y unchanged (a cosine index normalises itself)."""
    space = Space.parse(space)
    if space is Space.LORENTZ:
        return lorentz.expmap0(y, curv)
    if space in CHART_SPACES:
        return y
    raise ValueError(f"post-hoc maps write {', '.join(s.value for s in CHART_SPACES)} embeddings, not {space.value}")


@register_adapter
class ChartMap(nn.Module):
    """x (N, D_source) of ``source_space`` → from_chart(g(to_chart(x)), ``target_space``) (N, D_target).

    ``map`` g is any registered adapter kind from the source chart (D_source′) to the target chart
    (D_target′); its spec nests in this one's. A rotation g between two Lorentz charts is an
    isometry of hyperbolic space fixing the origin.
    """

    kind = "chart_map"

    def __init__(self, adapter: nn.Module, source_space: Space | str, source_curv: float,
                 target_space: Space | str, target_curv: float):
        super().__init__()
        self.map = adapter
        self.source_space, self.target_space = Space.parse(source_space), Space.parse(target_space)
        for space in (self.source_space, self.target_space):
            if space not in CHART_SPACES:
                raise ValueError(f"ChartMap: no chart for {space.value} embeddings")
        self.source_curv, self.target_curv = float(source_curv), float(target_curv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return from_chart(self.map(to_chart(x, self.source_space, self.source_curv)), self.target_space, self.target_curv)

    def to_spec(self) -> dict[str, Any]:
        return {"map": adapter_spec(self.map), "source_space": self.source_space.value, "source_curv": self.source_curv,
                "target_space": self.target_space.value, "target_curv": self.target_curv}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> ChartMap:
        return cls(build_adapter(spec["map"]), spec["source_space"], float(spec["source_curv"]),
                   spec["target_space"], float(spec["target_curv"]))


@register_adapter
class LowRankAffineAdapter(nn.Module):
    """g(x) = U (Vᵀ x) + b: an affine map whose matrix W = U Vᵀ has rank at most r (Drift-Adapter's
    low-rank affine map). U (out_dim, r), V (in_dim, r), b (out_dim,); x (..., in_dim) → (..., out_dim)."""

    kind = "low_rank_affine"

    def __init__(self, in_dim: int, out_dim: int, rank: int):
        super().__init__()
        if not 1 <= rank <= min(in_dim, out_dim):
            raise ValueError(f"rank must be in [1, min(in_dim, out_dim) = {min(in_dim, out_dim)}], got {rank!r}")
        self.left = nn.Parameter(torch.zeros(out_dim, rank))
        self.right = nn.Parameter(torch.zeros(in_dim, rank))
        self.bias = nn.Parameter(torch.zeros(out_dim))

    @property
    def weight(self) -> torch.Tensor:
        """W = U Vᵀ (out_dim, in_dim)."""
        return self.left @ self.right.T

    def to_spec(self) -> dict[str, Any]:
        return {"in_dim": int(self.right.shape[0]), "out_dim": int(self.left.shape[0]), "rank": int(self.left.shape[1])}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> LowRankAffineAdapter:
        return cls(int(spec["in_dim"]), int(spec["out_dim"]), int(spec["rank"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.right) @ self.left.T + self.bias


@register_adapter
class ResidualMLPAdapter(nn.Module):
    """g(x) = R x + W₂ relu(W₁ x + b₁) + b₂: a two-layer perceptron learning the residual of a FIXED
    linear map R (out_dim, in_dim), a buffer saved with the weights (the Procrustes map, so g starts
    there: W₂ and b₂ start at 0). W₁ (hidden_dim, in_dim), W₂ (out_dim, hidden_dim)."""

    kind = "residual_mlp"

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int):
        super().__init__()
        self.register_buffer("base", torch.eye(out_dim, in_dim))
        self.hidden = nn.Linear(in_dim, hidden_dim)
        self.output = nn.Linear(hidden_dim, out_dim)
        with torch.no_grad():
            self.output.weight.zero_()
            self.output.bias.zero_()

    def to_spec(self) -> dict[str, Any]:
        return {"in_dim": int(self.hidden.in_features), "out_dim": int(self.output.out_features),
                "hidden_dim": int(self.hidden.out_features)}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> ResidualMLPAdapter:
        return cls(int(spec["in_dim"]), int(spec["out_dim"]), int(spec["hidden_dim"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.base.T + self.output(torch.relu(self.hidden(x)))


#: Below this sin θ the two directions are taken as parallel and interpolated linearly (the limit θ → 0).
SLERP_PARALLEL_EPS = 1e-7


def spherical_interpolation(start: torch.Tensor, end: torch.Tensor, weight: float) -> torch.Tensor:
    """slerp(a, b; t) = sin((1 − t) θ) / sin θ · a + sin(t θ) / sin θ · b with θ = arccos⟨a, b⟩,
    a = start / ‖start‖, b = end / ‖end‖, row by row: the point a fraction t of the way along the
    great circle from a to b (t = 0: a, t = 1: b; unit norm for every t). Where sin θ falls below
    ``SLERP_PARALLEL_EPS`` (a ≈ ±b) the normalised linear interpolation ((1 − t) a + t b) / ‖·‖, the
    limit θ → 0. start, end (N, D); computed in float64, returned (N, D) in ``start``'s dtype."""
    if start.shape != end.shape:
        raise ValueError(f"spherical interpolation needs two (N, D) matrices of one shape, got "
                         f"{tuple(start.shape)} and {tuple(end.shape)}")
    a = F.normalize(start.double(), dim=-1)
    b = F.normalize(end.double().to(a.device), dim=-1)
    theta = torch.arccos((a * b).sum(dim=-1, keepdim=True).clamp(-1.0, 1.0))
    sin_theta = torch.sin(theta)
    parallel = sin_theta < SLERP_PARALLEL_EPS
    safe = torch.where(parallel, torch.ones_like(sin_theta), sin_theta)
    arc = (torch.sin((1.0 - weight) * theta) * a + torch.sin(weight * theta) * b) / safe
    linear = F.normalize((1.0 - weight) * a + weight * b, dim=-1)
    return torch.where(parallel, linear, arc).to(start.dtype)


@register_adapter
class QueryInterpolation(nn.Module):
    """x (N, D_new) and the parent's embeddings y (N, D_old) of the same queries →
    slerp(align(x), y; t) (N, D_old) (``spherical_interpolation``): the new model's query aligned
    into the parent's space, then moved a fraction t = ``weight`` of the way towards the parent's own
    query on the unit sphere (training-free backward compatibility, miccunifi/
    SLERP_backward_compatibility). ``align`` is any registered adapter kind into the parent's
    space (the spherical interpolation method stores a ``ChartMap`` of the Procrustes rotation).

    Unlike the other adapters it needs the target generation's embedding of the query itself
    (``needs_target_queries``): the comparison rules pass it (``orchestrator.comparison``)."""

    kind = "slerp"
    needs_target_queries = True

    def __init__(self, align: nn.Module, weight: float):
        super().__init__()
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"QueryInterpolation: weight t must be in [0, 1], got {weight!r}")
        self.align, self.weight = align, float(weight)

    def forward(self, x: torch.Tensor, target_queries: torch.Tensor) -> torch.Tensor:
        return spherical_interpolation(self.align(x), target_queries, self.weight)

    def to_spec(self) -> dict[str, Any]:
        return {"align": adapter_spec(self.align), "weight": self.weight}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> QueryInterpolation:
        return cls(build_adapter(spec["align"]), float(spec["weight"]))
