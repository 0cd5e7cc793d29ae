"""Learnable curvature magnitude, shared by a hyperbolic lift and the head that reads its points."""
from __future__ import annotations

import math

import torch
from torch import nn

#: MERU's bounds on a learned curvature magnitude (Desai et al. 2023; HBCT §15 item 22).
MIN_LEARNED_CURV = 0.1
MAX_LEARNED_CURV = 10.0


class LearnableCurvature(nn.Module):
    """``curv = exp(log_curv)``, with ``log_curv`` kept inside ``[log 0.1, log 10]`` (MERU).

    Calling the module returns the current curvature magnitude as a 0-d tensor that carries
    gradients to ``log_curv``. Like MERU, the clamp acts on the parameter's data (before each
    read), so gradients are never zeroed by the clamp itself.

    Decision: the parameter is the log of the magnitude because that keeps it positive without
    a constraint, as MERU does.
    """

    def __init__(self, init: float = 1.0, min_curv: float = MIN_LEARNED_CURV, max_curv: float = MAX_LEARNED_CURV):
        super().__init__()
        if not 0.0 < min_curv <= max_curv < float("inf"):
            raise ValueError(f"need 0 < min_curv <= max_curv < inf, got min_curv={min_curv!r}, max_curv={max_curv!r}")
        if not min_curv <= init <= max_curv:
            raise ValueError(f"init must lie in [{min_curv}, {max_curv}], got init={init!r}")
        self.log_min = math.log(min_curv)
        self.log_max = math.log(max_curv)
        self.log_curv = nn.Parameter(torch.tensor(math.log(init)))

    def forward(self) -> torch.Tensor:
        """Current curvature magnitude, a 0-d tensor in [min_curv, max_curv]."""
        with torch.no_grad():
            self.log_curv.clamp_(self.log_min, self.log_max)
        return self.log_curv.exp()


Curvature = float | LearnableCurvature


def resolve_curv(curv: Curvature) -> float | torch.Tensor:
    """A float curvature as is; a ``LearnableCurvature`` evaluated to its current 0-d tensor."""
    return curv() if isinstance(curv, LearnableCurvature) else curv


def check_fixed_curv(curv: Curvature, name: str = "curv") -> Curvature:
    """Return ``curv`` as a float (or the learnable module) after checking a fixed value is finite and > 0."""
    if isinstance(curv, LearnableCurvature):
        return curv
    if isinstance(curv, bool) or not isinstance(curv, (int, float)):
        raise ValueError(f"{name} must be a positive float or a LearnableCurvature, got {curv!r}")
    if not 0.0 < float(curv) < float("inf"):
        raise ValueError(f"{name} must be finite and > 0 (the curvature is -{name}), got {curv!r}")
    return float(curv)
