"""Space lifts: map the encoder's Euclidean output z (B, d) to a point of the generation's space.

Every lift returns ``(features, embedding)``:
- ``features`` (B, d): the Euclidean vector right before the lift (for the hyperbolic lifts, the
  tangent vector at the origin after rescale and clip);
- ``embedding``: the point in the space, (B, d) or (B, d+1) for Lorentz (time coordinate first).

Every lift has ``space`` (a ``Space``) and ``curv`` (positive magnitude, the space has curvature
``-curv``): a float, or a 0-d tensor with gradients when the curvature is learned.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.geometry import lorentz, poincare
from orchestrator.geometry.spaces import Space
from orchestrator.models.curvature import LearnableCurvature, check_fixed_curv, resolve_curv

#: Floor on ||z|| in the norm clip, so ``clip / ||z||`` stays finite (and equals min(1, .) = 1) at z = 0.
_MIN_NORM = 1e-12


def clip_norm(z: torch.Tensor, clip: float | None) -> torch.Tensor:
    """``z * min(1, clip / ||z||)`` row-wise (HBCT §3, Bdeir's "clipped" feature); ``clip=None`` is a no-op.

    z: (..., d) -> (..., d) with ``||out|| <= clip``.
    """
    if clip is None:
        return z
    norm = z.norm(dim=-1, keepdim=True).clamp_min(_MIN_NORM)
    return z * torch.clamp(clip / norm, max=1.0)


def _check_clip(clip: float | None) -> float | None:
    if clip is None:
        return None
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not 0.0 < float(clip) < float("inf"):
        raise ValueError(f"clip must be a finite float > 0 or None, got {clip!r}")
    return float(clip)


def _make_curv(curv: float, learn_curv: bool) -> float | LearnableCurvature:
    value = check_fixed_curv(curv)
    return LearnableCurvature(init=value) if learn_curv else value


class EuclideanLift(nn.Module):
    """Identity: features = embedding = z (B, d). ``curv`` is 0.0 (flat; never read by Euclidean distances)."""

    space = Space.EUCLIDEAN
    curv = 0.0

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return z, z


class CosineLift(nn.Module):
    """L2-normalise: features = raw z (B, d), embedding = z / ||z|| on the unit sphere.

    ``curv`` is 0.0: it is not a hyperbolic space and cosine distances ignore it.
    """

    space = Space.COSINE
    curv = 0.0

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return z, F.normalize(z, dim=-1)


class _HyperbolicLift(nn.Module):
    """Shared curvature handling: fixed float or a ``LearnableCurvature`` submodule."""

    def __init__(self, curv: float, learn_curv: bool):
        super().__init__()
        self.curvature = _make_curv(curv, learn_curv)

    @property
    def curv(self) -> float | torch.Tensor:
        """Curvature magnitude: a float, or a 0-d tensor with gradients when learned."""
        return resolve_curv(self.curvature)


class LorentzLift(_HyperbolicLift):
    """Hybrid Euclidean -> Lorentz lift (HBCT §3): rescale, clip, ``expmap0``.

        z <- z / sqrt(d)                  (if rescale)
        z <- z * min(1, clip / ||z||)     (if clip is not None)
        h  = expmap0(z) in L^d            (B, d+1), time first

    ``features`` is the clipped tangent vector z (B, d); ``embedding`` is h (B, d+1).

    Decision: "rescale the norm of z by sqrt(d)" DIVIDES by sqrt(d), because HBCT says it follows
    MERU, whose learnable feature scale is initialised to d^-1/2; the scale is fixed (not learned)
    since HBCT names no learnable parameter (HBCT §15 item 2).
    Decision: with ``learn_curv`` the magnitude is ``exp`` of a parameter clamped to [0.1, 10], as
    in MERU (HBCT §15 item 22).
    """

    space = Space.LORENTZ

    def __init__(self, curv: float = 1.0, clip: float | None = 1.0, rescale: bool = True, learn_curv: bool = False):
        super().__init__(curv, learn_curv)
        self.clip = _check_clip(clip)
        self.rescale = bool(rescale)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rescale:
            z = z / math.sqrt(z.shape[-1])
        tangent = clip_norm(z, self.clip)
        return tangent, lorentz.expmap0(tangent, self.curv)


class PoincareLift(_HyperbolicLift):
    """Euclidean -> Poincaré ball lift (binary_hyperbolic §3: ``f(x) = exp_0^c(W backbone(x))``).

        z <- z * min(1, clip / ||z||)     (if clip is not None)
        e  = clip_to_ball(expmap0(z))     (B, d), ||e|| < 1/sqrt(curv)

    ``features`` is the (clipped) tangent vector z; ``embedding`` is e.
    Decision: no sqrt(d) rescale (the paper applies ``exp_0`` straight to the projection), and the
    ball margin of ``poincare.clip_to_ball`` is always applied, because float32 ``tanh`` saturates
    to the boundary for large tangent norms (binary_hyperbolic A16).
    """

    space = Space.POINCARE

    def __init__(self, curv: float = 0.1, clip: float | None = None, learn_curv: bool = False):
        super().__init__(curv, learn_curv)
        self.clip = _check_clip(clip)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tangent = clip_norm(z, self.clip)
        curv = self.curv
        return tangent, poincare.clip_to_ball(poincare.expmap0(tangent, curv), curv)


def build_lift(
    space: Space | str,
    curv: float = 1.0,
    clip: float | None = None,
    rescale: bool = True,
    learn_curv: bool = False,
) -> nn.Module:
    """Lift for ``space`` ("euclidean" | "cosine" | "lorentz" | "poincare").

    ``curv`` and ``rescale`` are ignored where they mean nothing (flat spaces; ``rescale`` is
    Lorentz-only, HBCT §3). ``clip`` and ``learn_curv`` on a flat space raise ValueError, since
    silently dropping them would hide a configuration mistake.
    """
    space = Space.parse(space)
    if space in (Space.EUCLIDEAN, Space.COSINE):
        if clip is not None:
            raise ValueError(f"clip must be None for the {space.value} space, got {clip!r}")
        if learn_curv:
            raise ValueError(f"learn_curv must be False for the flat {space.value} space, got {learn_curv!r}")
        return EuclideanLift() if space is Space.EUCLIDEAN else CosineLift()
    if space is Space.LORENTZ:
        return LorentzLift(curv=curv, clip=clip, rescale=rescale, learn_curv=learn_curv)
    return PoincareLift(curv=curv, clip=clip, learn_curv=learn_curv)
