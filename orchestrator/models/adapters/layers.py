"""Feature-space adapters and the λ-orthogonality regulariser (lambda_orthogonality.md §2.3-§2.5, §2.8).

- ``OrthogonalAdapter``: B_perp = expm(U - U^T), exactly orthogonal by construction (§2.3).
- ``AffineAdapter``: B_lambda(x) = W x + b (§2.4) and the forward map F (§2.5).
- ``MLPAdapter``: a two-layer perceptron, the forward map F of FCT (Ramanujan et al. 2022; §5).
- ``EmbeddingMap``: a fitted adapter applied to embeddings, L2-normalised first or not.
- ``gram_deviation`` / ``lambda_orthogonality_penalty``: D = ||W W^T - I||_F and L_λ = σ(α(D - λ))·D (eq. 6).
- ``truncate_to_common``: prefix truncation to the smaller dimension (§2.8).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.models.adapters.registry import adapter_spec, build_adapter, register_adapter

#: Added to ||W W^T - I||_F^2 before the square root, so D and its gradient are finite at D = 0.
GRAM_EPS = 1e-12


def _check_dim(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


@register_adapter
class OrthogonalAdapter(nn.Module):
    """Strictly orthogonal backward map B_perp(x) = expm(P) x with P = U - U^T (§2.3, eq. 2 setting).

    The learnable parameters are the dim(dim-1)/2 entries of the strictly upper-triangular U
    (Lezcano-Casado & Martínez-Rubio 2019). x (..., dim) -> (..., dim). No bias (§10 item 7).
    Decision: U starts at 0, so B_perp starts as the identity (§10 item 8 leaves the init open;
    identity starts from "new space as is" and keeps retrieval among new features unchanged anyway).
    """

    kind = "orthogonal"

    def __init__(self, dim: int):
        super().__init__()
        self.dim = _check_dim(dim, "dim")
        rows, cols = torch.triu_indices(dim, dim, offset=1)
        self.register_buffer("upper_rows", rows, persistent=False)
        self.register_buffer("upper_cols", cols, persistent=False)
        self.upper = nn.Parameter(torch.zeros(rows.numel()))

    def to_spec(self) -> dict[str, Any]:
        """What ``from_spec`` needs to rebuild this structure (the registry's contract)."""
        return {"dim": self.dim}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> OrthogonalAdapter:
        return cls(int(spec["dim"]))

    @property
    def matrix(self) -> torch.Tensor:
        """B_perp = matrix_exp(U - U^T), (dim, dim), orthogonal."""
        u = self.upper.new_zeros(self.dim, self.dim)
        u = u.index_put((self.upper_rows, self.upper_cols), self.upper)
        return torch.linalg.matrix_exp(u - u.T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (..., {self.dim}), got {tuple(x.shape)}")
        return x @ self.matrix.T


@register_adapter
class AffineAdapter(nn.Module):
    """Affine map x -> W x + b, W (out_dim, in_dim): B_lambda (§2.4) or the forward map F (§2.5).

    ``init="identity"`` (default): W = eye(out_dim, in_dim), b = 0. For a square map that is the
    identity (D = 0); for a rectangular one it is the prefix embedding/truncation, the same
    coordinate matching as ``truncate_to_common`` (§2.8). ``init="default"``: ``nn.Linear``'s init.
    Decision: identity by default, because it starts B_lambda at an exact orthogonal map and F at
    "old features as they are"; §10 item 8 leaves the init open (Fig. 2c uses a random init).
    """

    kind = "affine"

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, init: str = "identity"):
        super().__init__()
        if init not in ("identity", "default"):
            raise ValueError(f"init must be 'identity' or 'default', got {init!r}")
        self.linear = nn.Linear(_check_dim(in_dim, "in_dim"), _check_dim(out_dim, "out_dim"), bias=bias)
        if init == "identity":
            with torch.no_grad():
                self.linear.weight.copy_(torch.eye(out_dim, in_dim))
                if bias:
                    self.linear.bias.zero_()

    def to_spec(self) -> dict[str, Any]:
        return {"in_dim": int(self.linear.in_features), "out_dim": int(self.linear.out_features),
                "bias": self.linear.bias is not None}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> AffineAdapter:
        return cls(int(spec["in_dim"]), int(spec["out_dim"]), bias=bool(spec["bias"]))

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


@register_adapter
class MLPAdapter(nn.Module):
    """Two-layer perceptron x -> W2 relu(W1 x + b1) + b2: FCT's forward transformation F (§5).

    W1 (hidden_dim, in_dim), W2 (out_dim, hidden_dim); x (..., in_dim) -> (..., out_dim).
    ``nn.Linear``'s default init for both layers (a non-linear F has no natural identity start).
    No normalisation layer: F is fitted and applied on frozen embeddings in eval mode only, where
    a BatchNorm (FCT's reference uses one) is a fixed affine map the linear layers can absorb.
    """

    kind = "mlp"

    def __init__(self, in_dim: int, out_dim: int, hidden_dim: int):
        super().__init__()
        self.hidden = nn.Linear(_check_dim(in_dim, "in_dim"), _check_dim(hidden_dim, "hidden_dim"))
        self.output = nn.Linear(hidden_dim, _check_dim(out_dim, "out_dim"))

    def to_spec(self) -> dict[str, Any]:
        return {"in_dim": self.in_dim, "out_dim": self.out_dim, "hidden_dim": self.hidden_dim}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> MLPAdapter:
        return cls(int(spec["in_dim"]), int(spec["out_dim"]), int(spec["hidden_dim"]))

    @property
    def in_dim(self) -> int:
        return int(self.hidden.in_features)

    @property
    def out_dim(self) -> int:
        return int(self.output.out_features)

    @property
    def hidden_dim(self) -> int:
        return int(self.hidden.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(torch.relu(self.hidden(x)))


@register_adapter
class EmbeddingMap(nn.Module):
    """A fitted adapter ``map`` applied to embeddings, L2-normalised first when ``normalize_input``.

    x (N, in_dim) → map(x / ‖x‖ or x) (N, out_dim). The flag is a saved buffer, so a checkpoint
    carries it; ``map`` is the wrapped adapter itself (``OrthogonalAdapter``, ``AffineAdapter``,
    ``MLPAdapter`` or any registered kind), whose spec nests in this one's.
    """

    kind = "embedding_map"

    def __init__(self, adapter: nn.Module, normalize_input: bool):
        super().__init__()
        self.map = adapter
        self.register_buffer("normalize_input", torch.tensor(bool(normalize_input)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.map(F.normalize(x, dim=-1) if bool(self.normalize_input) else x)

    def to_spec(self) -> dict[str, Any]:
        return {"normalize_input": bool(self.normalize_input), "map": adapter_spec(self.map)}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> EmbeddingMap:
        return cls(build_adapter(spec["map"]), bool(spec["normalize_input"]))


def gram_deviation(weight: torch.Tensor) -> torch.Tensor:
    """D = ||W W^T - I||_F (Frobenius, not squared; lambda_orthogonality eqs. 5-6), a 0-d tensor.

    W (n, m) -> D. Computed as sqrt(sum (W W^T - I)^2 + 1e-12), so D = 1e-6 with a finite gradient
    when W W^T = I. For square W, ||W W^T - I||_F = ||W^T W - I||_F (§2.4).
    """
    if weight.dim() != 2:
        raise ValueError(f"weight must be a matrix (n, m), got shape {tuple(weight.shape)}")
    eye = torch.eye(weight.shape[0], dtype=weight.dtype, device=weight.device)
    residual = weight @ weight.T - eye
    return torch.sqrt((residual * residual).sum() + GRAM_EPS)


def lambda_orthogonality_penalty(weight: torch.Tensor, lam: float, alpha: float) -> torch.Tensor:
    """L_λ = sigmoid(α (D - λ)) · D with D = ||W W^T - I||_F (lambda_orthogonality eq. 6), 0-d tensor.

    Not a hinge: the gate multiplies the whole deviation, so L_λ ≈ D when D >> λ and ≈ 0 when
    D << λ; dL/dD = σ + α D σ(1 - σ) > 0. Gradients flow through both the gate and D (§10 item 9).
    ``lam`` >= 0 is the threshold on D (not a loss weight); ``alpha`` > 0 is the gate steepness.
    """
    if not 0.0 <= float(lam) < float("inf"):
        raise ValueError(f"lam must be finite and >= 0, got {lam!r}")
    if not 0.0 < float(alpha) < float("inf"):
        raise ValueError(f"alpha must be finite and > 0, got {alpha!r}")
    deviation = gram_deviation(weight)
    return torch.sigmoid(alpha * (deviation - lam)) * deviation


def truncate_to_common(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the first m = min(a.shape[-1], b.shape[-1]) coordinates of both (prefix truncation, §2.8)."""
    m = min(a.shape[-1], b.shape[-1])
    return a[..., :m], b[..., :m]
