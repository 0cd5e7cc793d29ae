"""Lorentz (hyperboloid) model of hyperbolic space with curvature ``-curv`` (HBCT §2, eqs. 1-7).

Points are FULL tensors ``(..., d+1)`` with the time coordinate FIRST: ``x[..., 0]`` is ``x_t`` and
``x[..., 1:]`` is ``x_s``. The hyperboloid is ``{x : <x,x>_L = -1/curv, x_t > 0}`` and the origin is
``[1/sqrt(curv), 0, ..., 0]``. ``curv`` (K in HBCT) is a positive float or a 0-d tensor; with a tensor
every function is differentiable in it (learnable curvature).

Numerical guards (HBCT §2 and §6 list MERU's; the float32 adaptations are stated where used):

* norms go through ``sqrt(max(||.||^2, 1e-30))``, so zero vectors give finite values and zero
  gradients instead of NaN;
* the ``sinh``/``cosh`` input of the exponential maps is clamped to ``<= asinh(2**15)`` (MERU), so
  ``||v|| = 1e4`` still gives a finite point (``||x_s|| = 2**15 / sqrt(K)``);
* distances use ``arccosh(-K<x,y>_L) = 2 asinh(sqrt(K) ||x-y||_L / 2)`` with the Lorentzian chord
  ``||x-y||_L^2 = <x-y, x-y>_L`` clamped at 1e-30 before ``sqrt``: identical in exact arithmetic, but
  with no ``arccosh'(1) = inf`` (in float32 MERU's ``clamp(min=1 + 1e-8)`` is ``clamp(min=1)``, whose
  gradient at ``x == y`` is NaN) and more accurate for nearby points;
* ``asin``/``acos`` arguments are kept ``4 * finfo(dtype).eps`` away from +-1 (MERU's 1e-8 rounds to
  1 in float32, where the derivative is infinite);
* functions that only need the space part (``logmap0``, uncertainty, entailment, ``to_poincare``)
  recompute ``x_t = sqrt(1/K + ||x_s||^2)`` from the constraint instead of trusting ``x[..., 0]``
  (MERU stores only ``x_s``); the maps that produce points do the same, so their outputs lie on
  the hyperboloid up to rounding of that one square root.
"""

from __future__ import annotations

import math

import torch

from orchestrator.geometry._numerics import (
    MIN_SQUARED_NORM,
    Curvature,
    boundary_eps,
    check_curv,
    safe_norm,
    sqrt_curv,
)

#: MERU's cap on the argument of ``sinh``/``cosh`` in the exponential maps: ``asinh(2**15)``.
MAX_SINH_INPUT = math.asinh(2.0**15)
#: MERU's floor on ``(K<x,y>_L)^2 - 1`` under the square root of the exterior angle.
_MIN_ANGLE_SINH_SQUARED = 1e-8
#: Floor on the exterior-angle denominator (keeps ``1/denominator^2`` finite in float32).
_MIN_ANGLE_DENOMINATOR = 1e-8


def _split(x: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(x_t (...), x_s (..., d))`` of a full Lorentz tensor, validating its last dimension."""
    if x.dim() == 0 or x.shape[-1] < 2:
        raise ValueError(
            f"{name} must have shape (..., d+1) with d >= 1 (time first), got {tuple(x.shape)}"
        )
    return x[..., 0], x[..., 1:]


def from_space(space: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Full point ``[x_t, x_s]`` above ``x_s``, ``x_t`` from the constraint (HBCT eq. 2): ``(..., d) -> (..., d+1)``."""
    return torch.cat([time_from_space(space, curv, keepdim=True), space], dim=-1)


def _distance_from_chord(chord_sq: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Geodesic distance from the squared Lorentzian chord ``<x-y, x-y>_L`` (HBCT eq. 3 rewritten).

    On the hyperboloid ``<x-y, x-y>_L = -2/K - 2<x,y>_L = (4/K) sinh^2(sqrt(K) d / 2)``, hence
    ``d = (1/sqrt K) arccosh(-K<x,y>_L) = (2/sqrt K) asinh(sqrt(K) ||x-y||_L / 2)``.
    """
    sk = sqrt_curv(curv)
    chord = torch.sqrt(torch.clamp(chord_sq, min=MIN_SQUARED_NORM))
    return 2.0 / sk * torch.asinh(sk * chord / 2.0)


def inner(x: torch.Tensor, y: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """Lorentz inner product ``<x,y>_L = <x_s,y_s> - x_t y_t`` (HBCT eq. 1).

    Shapes: ``(..., d+1), (..., d+1) -> (...)`` (``(..., 1)`` with ``keepdim``); batch dims broadcast.
    """
    x_t, x_s = _split(x, "x")
    y_t, y_s = _split(y, "y")
    product = (x_s * y_s).sum(dim=-1) - x_t * y_t
    return product.unsqueeze(-1) if keepdim else product


def pairwise_inner(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """All Lorentz inner products (HBCT eq. 1): ``(N, d+1), (M, d+1) -> (N, M)``."""
    x_t, x_s = _split(x, "x")
    y_t, y_s = _split(y, "y")
    return x_s @ y_s.transpose(-1, -2) - x_t.unsqueeze(-1) * y_t.unsqueeze(-2)


def time_from_space(xs: torch.Tensor, curv: Curvature, keepdim: bool = False) -> torch.Tensor:
    """Time coordinate ``x_t = sqrt(1/K + ||x_s||^2)`` of the point above ``x_s`` (HBCT eq. 2).

    Shapes: ``(..., d) -> (...)`` (``(..., 1)`` with ``keepdim``).
    """
    check_curv(curv)
    return torch.sqrt(1.0 / curv + (xs * xs).sum(dim=-1, keepdim=keepdim))


def origin(
    d: int,
    curv: Curvature,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The origin ``[1/sqrt(K), 0, ..., 0]`` of ``L^d``, shape ``(d+1,)``.

    ``dtype``/``device`` default to those of a tensor ``curv``, else float32 / CPU.
    """
    check_curv(curv)
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d must be an int >= 1, got {d!r}")
    if isinstance(curv, torch.Tensor):
        dtype = dtype or curv.dtype
        device = device or curv.device
        time = (1.0 / sqrt_curv(curv)).reshape(1).to(dtype=dtype, device=device)
        return torch.cat([time, torch.zeros(d, dtype=dtype, device=device)])
    point = torch.zeros(d + 1, dtype=dtype or torch.float32, device=device)
    point[0] = 1.0 / math.sqrt(curv)
    return point


def distance(x: torch.Tensor, y: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Geodesic distance ``(1/sqrt K) arccosh(-K<x,y>_L)`` (HBCT eq. 3), elementwise over the batch.

    Shapes: ``(..., d+1), (..., d+1) -> (...)``. Evaluated as ``(2/sqrt K) asinh(sqrt(K)||x-y||_L/2)``
    with ``<x-y,x-y>_L`` computed from the coordinate differences, so ``distance(x, x) = 0`` (to ~1e-15)
    and its gradient is finite (zero) there.
    """
    check_curv(curv)
    diff = x - y
    return _distance_from_chord(inner(diff, diff), curv)


def pairwise_distance(x: torch.Tensor, y: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """All geodesic distances (HBCT eq. 3): ``(N, d+1), (M, d+1) -> (N, M)``.

    ``<x-y,x-y>_L = ||x_s||^2 + ||y_s||^2 - 2<x_s,y_s> - (x_t - y_t)^2`` is formed with one matmul and
    (N, M) broadcasts, never an (N, M, d) tensor; the exact time difference keeps points near the
    origin accurate (an ``-2/K - 2<x,y>_L`` form loses ~eps/K absolute there).
    """
    check_curv(curv)
    x_t, x_s = _split(x, "x")
    y_t, y_s = _split(y, "y")
    space_sq = (
        (x_s * x_s).sum(dim=-1).unsqueeze(-1)
        + (y_s * y_s).sum(dim=-1).unsqueeze(-2)
        - 2.0 * (x_s @ y_s.transpose(-1, -2))
    )
    time_sq = (x_t.unsqueeze(-1) - y_t.unsqueeze(-2)) ** 2
    return _distance_from_chord(space_sq - time_sq, curv)


def project_tangent(p: torch.Tensor, u: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Orthogonal projection onto ``T_p L^d``: ``proj_p(u) = u + K <p,u>_L p`` (HBCT eq. 7, corrected).

    Decision: the printed eq. 7 is garbled (HBCT §16); this form satisfies ``<p, proj_p(u)>_L = 0``.
    Shapes: ``(..., d+1), (..., d+1) -> (..., d+1)``.
    """
    check_curv(curv)
    return u + curv * inner(p, u, keepdim=True) * p


def expmap(p: torch.Tensor, u: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Exponential map at ``p`` (HBCT eq. 5): ``cosh(sqrt(K)||u||_L) p + sinh(.)/(sqrt(K)||u||_L) u``.

    Shapes: ``p (..., d+1)`` on the hyperboloid, ``u (..., d+1)`` in ``T_p`` -> ``(..., d+1)``.
    Guards: ``||u||_L = sqrt(max(<u,u>_L, 1e-30))``; ``sqrt(K)||u||_L`` clamped to ``asinh(2**15)``;
    the time coordinate of the result is recomputed from its space part.
    """
    check_curv(curv)
    _split(p, "p")
    _split(u, "u")
    sk = sqrt_curv(curv)
    u_norm = torch.sqrt(torch.clamp(inner(u, u, keepdim=True), min=MIN_SQUARED_NORM))
    rate = torch.clamp(sk * u_norm, max=MAX_SINH_INPUT)
    point = torch.cosh(rate) * p + torch.sinh(rate) / (sk * u_norm) * u
    return from_space(point[..., 1:], curv)


def logmap(p: torch.Tensor, x: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Logarithmic map at ``p`` (HBCT eq. 6): ``arccosh(-K<p,x>_L)/sqrt((K<p,x>_L)^2 - 1) proj_p(x)``.

    Shapes: ``(..., d+1), (..., d+1) -> (..., d+1)`` (a tangent vector at ``p``).
    Evaluated as ``asinh(s)/s * proj_p(x)`` with ``s = sqrt(K) ||proj_p(x)||_L``; on the hyperboloid
    ``s^2 = (K<p,x>_L)^2 - 1`` and ``asinh(s) = arccosh(-K<p,x>_L)``, so this is eq. 6 without the
    ``arccosh``/``sqrt`` singularities at ``x == p`` (``s`` is floored at ``sqrt(K) * 1e-15``).
    """
    check_curv(curv)
    sk = sqrt_curv(curv)
    projected = project_tangent(p, x, curv)
    lorentz_sq = torch.clamp(inner(projected, projected, keepdim=True), min=MIN_SQUARED_NORM)
    scaled = sk * torch.sqrt(lorentz_sq)
    return torch.asinh(scaled) / scaled * projected


def expmap0(v: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Exponential map at the origin, closed form (HBCT §2; MERU ``exp_map0``).

    ``v (..., d)`` is the space part of a tangent vector at the origin (its time part is 0);
    returns ``[cosh(sqrt(K)||v||)/sqrt(K), sinh(sqrt(K)||v||) v/(sqrt(K)||v||)]`` of shape ``(..., d+1)``.
    Guards: ``sqrt(K)||v||`` is clamped to ``asinh(2**15)`` inside ``sinh`` (so ``logmap0`` only inverts
    it below that radius) and ``x_t`` is recomputed from ``x_s``.
    """
    check_curv(curv)
    if v.dim() == 0 or v.shape[-1] < 1:
        raise ValueError(f"v must have shape (..., d) with d >= 1, got {tuple(v.shape)}")
    sk = sqrt_curv(curv)
    v_norm = safe_norm(v, keepdim=True)
    rate = torch.clamp(sk * v_norm, max=MAX_SINH_INPUT)
    return from_space(torch.sinh(rate) / (sk * v_norm) * v, curv)


def logmap0(x: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Logarithmic map at the origin, closed form (HBCT §2; MERU ``log_map0``): ``(..., d+1) -> (..., d)``.

    ``arccosh(sqrt(K) x_t) x_s / (sqrt(K)||x_s||)`` with ``sqrt(K) x_t = sqrt(1 + K||x_s||^2)``, i.e.
    ``asinh(sqrt(K)||x_s||) x_s / (sqrt(K)||x_s||)``, which uses only ``x_s`` and has no singularity.
    """
    check_curv(curv)
    _, x_s = _split(x, "x")
    sk = sqrt_curv(curv)
    rate = sk * safe_norm(x_s, keepdim=True)
    return torch.asinh(rate) / rate * x_s


def uncertainty(x: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Hyperbolic uncertainty ``1 - ||x_s|| / x_t`` (HBCT eq. 10), shape ``(..., d+1) -> (...)``, in [0, 1].

    Decision: use the geometrically consistent form ``1 - ||h_s||/h_t``, which for ``h = expmap0(z)``
    equals ``1 - tanh(sqrt(K)||z||)``, because it lies in [0, 1] for every K, while the printed final
    form ``1 - tanh(sqrt(K)||z||)/sqrt(K)`` is negative for K < 1 and large ``||z||`` (HBCT §5, §15.4);
    at K = 1 they coincide. ``x_t`` is recomputed from ``x_s`` with the same squared norm as the
    numerator, so ``||x_s|| <= x_t`` holds in floating point and the value never leaves [0, 1].
    """
    check_curv(curv)
    _, x_s = _split(x, "x")
    squared = (x_s * x_s).sum(dim=-1)
    space_norm = torch.sqrt(torch.clamp(squared, min=MIN_SQUARED_NORM))
    return 1.0 - space_norm / torch.sqrt(1.0 / curv + squared)


def half_aperture(x: torch.Tensor, curv: Curvature, min_radius: float = 0.1) -> torch.Tensor:
    """Half-aperture of the entailment cone at ``x``: ``arcsin(2 eps / (sqrt(K)||x_s||))`` (HBCT eq. 11).

    Shapes: ``(..., d+1) -> (...)``. ``min_radius`` is HBCT's epsilon (MERU ``min_radius``, default 0.1).
    Guard: the ``arcsin`` argument is clamped to ``<= 1 - 4 eps_dtype``, so points with
    ``sqrt(K)||x_s|| <= 2 min_radius`` (incl. the origin) get an aperture of ~pi/2 and zero gradient.
    """
    check_curv(curv)
    if not 0.0 < min_radius < float("inf"):
        raise ValueError(f"min_radius must be finite and > 0, got {min_radius!r}")
    _, x_s = _split(x, "x")
    ratio = 2.0 * min_radius / (sqrt_curv(curv) * safe_norm(x_s))
    return torch.asin(torch.clamp(ratio, max=1.0 - boundary_eps(ratio.dtype)))


def exterior_angle(x: torch.Tensor, y: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Exterior angle ``pi - angle(O, x, y)`` at the apex ``x`` (parent/old) towards ``y`` (child/new).

    HBCT §6 / MERU ``oxy_angle``: ``arccos((y_t + x_t K<x,y>_L) / (||x_s|| sqrt((K<x,y>_L)^2 - 1)))``.
    It is 0 when ``y`` lies on the geodesic ray from the origin beyond ``x`` and pi when ``y`` lies
    between the origin and ``x``. Shapes: ``(..., d+1), (..., d+1) -> (...)``, values in [0, pi].
    Guards: ``(K<x,y>_L)^2 - 1`` floored at 1e-8 (MERU); the denominator floored at 1e-8 (MERU adds
    1e-8 instead, which biases the cosine by ~1e-8 relative and so the angle near 0 by ~1e-4 rad);
    ``arccos`` argument kept ``4 eps_dtype`` inside [-1, 1]; times are recomputed from the space parts.
    The angle is undefined at ``x == y`` and at an apex at the origin; a finite value is returned
    there (the gradient w.r.t. an apex at the origin is finite but large, ~1e12 in float32).
    """
    check_curv(curv)
    _, x_s = _split(x, "x")
    _, y_s = _split(y, "y")
    x_t = time_from_space(x_s, curv)
    y_t = time_from_space(y_s, curv)
    k_inner = curv * ((x_s * y_s).sum(dim=-1) - x_t * y_t)
    numerator = y_t + k_inner * x_t
    sinh_distance = torch.sqrt(torch.clamp(k_inner**2 - 1.0, min=_MIN_ANGLE_SINH_SQUARED))
    denominator = torch.clamp(safe_norm(x_s) * sinh_distance, min=_MIN_ANGLE_DENOMINATOR)
    cosine = numerator / denominator
    margin = 1.0 - boundary_eps(cosine.dtype)
    return torch.acos(torch.clamp(cosine, min=-margin, max=margin))


def to_poincare(x: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Isometry onto the Poincaré ball of radius ``1/sqrt(K)``: ``p = x_s / (1 + sqrt(K) x_t)``.

    Shapes: ``(..., d+1) -> (..., d)``. For K = 1 this is binary_hyperbolic.md eq. 12; distances match
    ``poincare.distance(p, q, curv)``. ``x_t`` is recomputed from ``x_s`` (so the denominator is >= 2).
    """
    check_curv(curv)
    _, x_s = _split(x, "x")
    return x_s / (1.0 + sqrt_curv(curv) * time_from_space(x_s, curv, keepdim=True))


def from_poincare(p: torch.Tensor, curv: Curvature) -> torch.Tensor:
    """Inverse of :func:`to_poincare`: ``x_s = 2p / (1 - K||p||^2)``, ``x_t`` from the constraint.

    Shapes: ``(..., d) -> (..., d+1)``. Guard: ``1 - K||p||^2`` is floored at ``4 eps_dtype`` so points
    on (or, by rounding, outside) the boundary map to finite points.
    """
    check_curv(curv)
    conformal = 1.0 - curv * (p * p).sum(dim=-1, keepdim=True)
    space = 2.0 * p / torch.clamp(conformal, min=boundary_eps(p.dtype))
    return from_space(space, curv)
