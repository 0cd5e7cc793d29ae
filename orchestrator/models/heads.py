"""Classification heads: ``forward(embedding) -> logits (B, C)``; every head has ``num_classes``.

- ``LinearHead``            Euclidean softmax classifier (BCT-style, trainable).
- ``CosineHead``            scaled cosine classifier (normalised weights and inputs).
- ``LorentzMLR``            hyperbolic multinomial logistic regression on the hyperboloid (HBCT §4).
- ``DSimplexHead``          fixed d-Simplex classifier (stationary_dsimplex §4).
- ``PoincarePrototypeHead`` fixed prototypes in the Poincaré ball, logits = -distance (binary_hyperbolic §3).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.geometry import poincare, simplex
from orchestrator.models.curvature import Curvature, check_fixed_curv, resolve_curv

#: Floor on ||z_c|| in the Lorentz MLR (the hyperplane normal's Lorentz norm equals ||z_c||).
_MIN_NORMAL_NORM = 1e-6


def _check_positive_int(value: int, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_last_dim(x: torch.Tensor, expected: int, name: str) -> None:
    if x.dim() != 2 or x.shape[-1] != expected:
        raise ValueError(f"{name} must have shape (B, {expected}), got {tuple(x.shape)}")


class LinearHead(nn.Linear):
    """Trainable linear softmax classifier: logits = x W^T + b, W (C, in_dim), b (C,).

    A plain ``nn.Linear`` (same init, same state-dict keys ``weight``/``bias``) with ``num_classes``.
    """

    def __init__(self, in_dim: int, num_classes: int, bias: bool = True):
        super().__init__(_check_positive_int(in_dim, "in_dim"), _check_positive_int(num_classes, "num_classes"), bias=bias)

    @property
    def in_dim(self) -> int:
        return self.in_features

    @property
    def num_classes(self) -> int:
        return self.out_features


def expand_linear_head(
    head: LinearHead,
    new_num_classes: int,
    init_rows: torch.Tensor | None = None,
    init_bias: torch.Tensor | None = None,
) -> LinearHead:
    """A new ``LinearHead`` with ``new_num_classes`` rows whose first ``head.num_classes`` rows copy ``head``.

    The extra rows are ``init_rows`` (new_num_classes - C_old, in_dim) when given (e.g. BCT's
    synthesised old-classifier rows = class means of old-model features), otherwise ``nn.Linear``'s
    default init. Extra bias entries are ``init_bias`` when given, else 0 when ``init_rows`` is given
    (Decision: a synthesised row carries no bias information), else the default init.
    The copy is detached: the returned head shares no storage with ``head``.
    """
    old = head.num_classes
    if isinstance(new_num_classes, bool) or not isinstance(new_num_classes, int) or new_num_classes < old:
        raise ValueError(f"new_num_classes must be an int >= head.num_classes={old}, got {new_num_classes!r}")
    extra = new_num_classes - old
    has_bias = head.bias is not None
    new = LinearHead(head.in_dim, new_num_classes, bias=has_bias).to(device=head.weight.device, dtype=head.weight.dtype)
    if init_rows is not None and tuple(init_rows.shape) != (extra, head.in_dim):
        raise ValueError(f"init_rows must have shape ({extra}, {head.in_dim}), got {tuple(init_rows.shape)}")
    if init_bias is not None:
        if not has_bias:
            raise ValueError("init_bias given but the head has no bias")
        if tuple(init_bias.shape) != (extra,):
            raise ValueError(f"init_bias must have shape ({extra},), got {tuple(init_bias.shape)}")
    with torch.no_grad():
        new.weight[:old] = head.weight
        if init_rows is not None:
            new.weight[old:] = init_rows.to(new.weight)
        if has_bias:
            new.bias[:old] = head.bias
            if init_bias is not None:
                new.bias[old:] = init_bias.to(new.bias)
            elif init_rows is not None:
                new.bias[old:] = 0.0
    return new


class CosineHead(nn.Module):
    """Cosine classifier: logits = scale * cos(x, w_c), x (B, in_dim), W (C, in_dim) -> (B, C)."""

    def __init__(self, in_dim: int, num_classes: int, scale: float = 16.0):
        super().__init__()
        _check_positive_int(in_dim, "in_dim")
        self.num_classes = _check_positive_int(num_classes, "num_classes")
        if not 0.0 < float(scale) < float("inf"):
            raise ValueError(f"scale must be finite and > 0, got {scale!r}")
        self.scale = float(scale)
        self.weight = nn.Parameter(torch.empty(num_classes, in_dim))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's default

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        _check_last_dim(embedding, self.weight.shape[1], "embedding")
        return self.scale * F.normalize(embedding, dim=-1) @ F.normalize(self.weight, dim=-1).T


class LorentzMLR(nn.Module):
    """Lorentz multinomial logistic regression (HBCT eq. 9, closed form of Bdeir et al. 2023, HBCT §4).

    Class c has an offset ``a_c`` and a Euclidean normal ``z_c`` (d,); its hyperplane normal is
    ``w_c = [sinh(sqrt(K) a_c) ||z_c||, cosh(sqrt(K) a_c) z_c]`` with ``||w_c||_L = ||z_c||``. For
    Lorentz points h (B, d+1), time first::

        alpha_c = cosh(sqrt(K) a_c) <z_c, h_s> - sinh(sqrt(K) a_c) ||z_c|| h_t     (= <w_c, h>_L)
        logit_c = (||z_c|| / sqrt(K)) * asinh(sqrt(K) alpha_c / ||z_c||)
                = sign(alpha_c) ||w_c||_L d_L(h, H_{w_c})

    ``||z_c||`` is floored at 1e-6. Init (Bdeir): ``a_c ~ U(-1/sqrt(d), 1/sqrt(d))`` and
    ``z_c ~ U(-s/sqrt(d), s/sqrt(d))`` with ``s = init_scale`` (Bdeir: s = 1, ``||z_c|| ~ 0.58``).
    Decision: keep the offset ``a_c`` (Bdeir's code, which HBCT cites for the closed form) rather
    than hyperplanes through the origin; ``a_c = 0`` recovers the paper's literal ``w_c in T_o``.
    ``init_scale``: the paper gives no init. The logits are linear in ``||z_c||`` (``alpha_c /
    ||z_c||`` does not depend on it), and the lifted points stay within a distance ζ of the origin,
    so ``||z_c||`` IS the logit scale; with s = 1 the logits start within about ±0.6 and SGD needs
    many epochs to grow them (the CE stays near ln C). A larger s only starts the same family of
    functions at a larger scale (the equation is unchanged).
    ``learn_scale``: multiply the logits by a learned scalar ``t = exp(log_t)``, ``log_t`` initialised
    to 0 (t = 1) and clamped to at most ``ln max_scale`` in the forward pass (MERU / CLIP's learned
    logit scale, max_scale = 100). Since the logits are linear in ``||z_c||``, ``t`` is one scale shared by every class's
    ``||z_c||``: the same family of functions (eq. 9 unchanged), reparameterised so that one
    parameter, whose gradient sums over all classes, can raise the logit scale quickly.
    ``curv`` is a float or the ``LearnableCurvature`` shared with the lift.
    """

    def __init__(self, dim: int, num_classes: int, curv: Curvature = 1.0, init_scale: float = 1.0,
                 learn_scale: bool = False, max_scale: float = 100.0):
        super().__init__()
        self.dim = _check_positive_int(dim, "dim")
        self.num_classes = _check_positive_int(num_classes, "num_classes")
        self.curvature = check_fixed_curv(curv)
        if isinstance(init_scale, bool) or not 0.0 < float(init_scale) < float("inf"):
            raise ValueError(f"init_scale must be finite and > 0, got {init_scale!r}")
        bound = 1.0 / math.sqrt(dim)
        self.a = nn.Parameter(torch.empty(num_classes).uniform_(-bound, bound))
        self.z = nn.Parameter(torch.empty(num_classes, dim).uniform_(-bound, bound) * float(init_scale))
        if isinstance(max_scale, bool) or not 1.0 <= float(max_scale) < float("inf"):
            raise ValueError(f"max_scale must be finite and >= 1, got {max_scale!r}")
        self.log_scale = nn.Parameter(torch.zeros(())) if learn_scale else None
        self.max_log_scale = math.log(float(max_scale))

    @property
    def logit_scale(self) -> torch.Tensor | float:
        """The learned logit scale t (a 0-d tensor with gradients), or 1.0 when not learned."""
        if self.log_scale is None:
            return 1.0
        return self.log_scale.clamp(max=self.max_log_scale).exp()

    @property
    def curv(self) -> float | torch.Tensor:
        return resolve_curv(self.curvature)

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        _check_last_dim(embedding, self.dim + 1, "embedding")
        sqrt_k = self.curv**0.5
        time, space = embedding[:, :1], embedding[:, 1:]
        z_norm = self.z.norm(dim=-1).clamp_min(_MIN_NORMAL_NORM)  # (C,)
        shifted = sqrt_k * self.a
        alpha = torch.cosh(shifted) * (space @ self.z.T) - torch.sinh(shifted) * z_norm * time  # (B, C)
        return self.logit_scale * z_norm / sqrt_k * torch.asinh(sqrt_k * alpha / z_norm)


class DSimplexHead(nn.Module):
    """Fixed d-Simplex classifier (stationary_dsimplex §4.1-§4.2): logits = z W^T, W (K, K-1) a buffer.

    No bias, no scale, no feature normalisation (§4.2); nothing is trainable. The input must be
    (B, K-1): ``in_dim`` (if given) must equal ``num_classes - 1``.
    """

    def __init__(self, num_classes: int, in_dim: int | None = None, normalization: str = "unit"):
        super().__init__()
        self.num_classes = _check_positive_int(num_classes, "num_classes", minimum=2)
        if in_dim is not None and in_dim != num_classes - 1:
            raise ValueError(
                f"in_dim must equal num_classes - 1 = {num_classes - 1} for a d-Simplex head, got {in_dim!r}"
            )
        self.in_dim = num_classes - 1
        self.register_buffer("weight", simplex.dsimplex_vertices(num_classes, normalization=normalization))

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        _check_last_dim(embedding, self.in_dim, "embedding")
        return embedding @ self.weight.T


def dsimplex_finetune_targets(labels: torch.Tensor, num_prototypes: int) -> torch.Tensor:
    """Fine-tuning class -> d-Simplex prototype index, assigned right to left: ``y -> K - 1 - y``.

    stationary_dsimplex §4.3: pre-training classes take prototypes 0, 1, 2, ... (``y -> y``); the
    fine-tuning classes take K-1, K-2, ... so the two sets never overlap while both fit in K.
    """
    _check_positive_int(num_prototypes, "num_prototypes", minimum=2)
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_prototypes):
        raise ValueError(
            f"labels must lie in [0, {num_prototypes - 1}], got range [{int(labels.min())}, {int(labels.max())}]"
        )
    return num_prototypes - 1 - labels


def simplex_prototypes_in_ball(num_classes: int, dim: int, radius: float) -> torch.Tensor:
    """Maximally separated class prototypes (Kasarla et al. 2022; binary_hyperbolic §3), (C, dim).

    The vertices of a regular simplex centred at 0 (``simplex.dsimplex_vertices``, unit rows in
    R^(C-1)), zero-padded to ``dim`` coordinates and scaled to norm ``radius``: pairwise cosine
    -1/(C-1), so every pair is equidistant in any metric that depends only on norms and angles.
    ``radius`` must be < 1/sqrt(curv) of the ball they are used in (checked by the head).
    """
    _check_positive_int(num_classes, "num_classes", minimum=2)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < num_classes - 1:
        raise ValueError(f"dim must be an int >= num_classes - 1 = {num_classes - 1}, got {dim!r}")
    if not 0.0 < float(radius) < float("inf"):
        raise ValueError(f"radius must be finite and > 0, got {radius!r}")
    vertices = simplex.dsimplex_vertices(num_classes, normalization="unit", dtype=torch.float64)
    vertices = vertices / vertices.norm(dim=1, keepdim=True)  # exact unit rows (drop the +1e-8)
    return (F.pad(vertices, (0, dim - (num_classes - 1))) * float(radius)).to(torch.float32)


class PoincarePrototypeHead(nn.Module):
    """Fixed prototypes in the Poincaré ball: logits = -d_c(e, p_y) (binary_hyperbolic §3, eq. 30).

    prototypes (C, d) is a buffer (not trainable); every row must satisfy ||p|| < 1/sqrt(curv).
    Input e (B, d) -> logits (B, C). Decision: no temperature on -d (the spec states none, A7).
    """

    def __init__(self, prototypes: torch.Tensor, curv: float = 0.1):
        super().__init__()
        if prototypes.dim() != 2 or prototypes.shape[0] < 1:
            raise ValueError(f"prototypes must have shape (C, d) with C >= 1, got {tuple(prototypes.shape)}")
        if not isinstance(curv, (int, float)) or isinstance(curv, bool):
            raise ValueError(f"curv must be a fixed float for fixed prototypes, got {curv!r}")
        self.curv = check_fixed_curv(curv)
        max_norm = float(prototypes.detach().norm(dim=1).max())
        if not max_norm < 1.0 / math.sqrt(self.curv):
            raise ValueError(
                f"prototypes must lie inside the ball of radius 1/sqrt(curv) = {1.0 / math.sqrt(self.curv):.6g}, "
                f"got a prototype of norm {max_norm:.6g}"
            )
        self.num_classes = prototypes.shape[0]
        self.register_buffer("prototypes", prototypes.detach().clone())

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        _check_last_dim(embedding, self.prototypes.shape[1], "embedding")
        return -poincare.pairwise_distance(embedding, self.prototypes, self.curv)
