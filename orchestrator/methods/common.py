"""Pieces several methods share: the supervised base objective and class means."""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from orchestrator.geometry.spaces import Space
from orchestrator.methods.base import CompatibilityMethod, MethodParams
from orchestrator.models.heads import LinearHead, LorentzMLR
from orchestrator.models.lifts import build_lift
from orchestrator.models.outputs import ModelOutput


class FlatParams(MethodParams):
    """space: ``cosine`` (the Euclidean baselines of HBCT: linear softmax training, cosine
    retrieval) or ``euclidean`` (L2 retrieval)."""

    space: Literal["cosine", "euclidean"] = "cosine"


class SupervisedParams(FlatParams):
    """Space settings of methods that also train in the Lorentz space.

    space: as ``FlatParams``, or ``lorentz`` (HBCT's φ_o / φ_* hyperbolic models: √d rescale,
           clip ζ, exp map, Lorentz MLR head; hbct.md §3-§4).
    curv:  curvature magnitude K of the Lorentz space (ignored by flat spaces).
    clip:  the norm clip ζ of the Lorentz lift (old model ζ_o = 1.0; new models ζ_n = ζ_o + 0.2).
    """

    space: Literal["cosine", "euclidean", "lorentz"] = "cosine"
    curv: float = Field(1.0, gt=0)
    clip: float = Field(1.0, gt=0)


class SupervisedMethod(CompatibilityMethod):
    """A method whose base objective is softmax cross-entropy through its own trainable head.

    Heads: a linear softmax classifier for flat spaces (BCT's setting; hbct.md §13 leaves the
    Euclidean head open, decision: linear with bias), the Lorentz MLR for the Lorentz space.
    """

    Params = FlatParams

    @property
    def space(self) -> Space:
        return Space(self.params.space)

    def build_lift(self) -> nn.Module:
        if self.space is Space.LORENTZ:
            return build_lift(self.space, curv=self.params.curv, clip=self.params.clip)
        return build_lift(self.space)

    def build_head(self, embed_dim: int, num_classes: int) -> nn.Module:
        if self.space is Space.LORENTZ:
            return LorentzMLR(embed_dim, num_classes, curv=self.params.curv)
        return LinearHead(embed_dim, num_classes)

    def base_loss(self, new: ModelOutput, labels: torch.Tensor) -> torch.Tensor:
        """Softmax cross-entropy of the new head's logits (B, C) against labels (B,), batch mean."""
        return F.cross_entropy(new.logits, labels)


def class_means(embeddings: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class mean of ``embeddings`` (N, d) grouped by ``labels`` (N,).

    Returns ``(means (num_classes, d), present (num_classes,) bool)``; rows of absent classes are 0.
    """
    if labels.numel() and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"class_means: labels must lie in [0, {num_classes}), got range "
                         f"[{int(labels.min())}, {int(labels.max())}]")
    sums = torch.zeros(num_classes, embeddings.shape[1], dtype=embeddings.dtype, device=embeddings.device)
    sums.index_add_(0, labels, embeddings)
    counts = torch.bincount(labels, minlength=num_classes).to(embeddings.dtype)
    present = counts > 0
    means = sums / counts.clamp(min=1).unsqueeze(1)
    return means, present


def normalized_class_means(embeddings: torch.Tensor, labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Class means of L2-normalised embeddings, re-normalised (prototype_perturbation.md §2 choice).

    Returns ``(prototypes (num_classes, d) unit-norm or 0 for absent classes, present (num_classes,))``.
    """
    means, present = class_means(F.normalize(embeddings, dim=1), labels, num_classes)
    return F.normalize(means, dim=1) * present.unsqueeze(1), present


def require_parent(ctx_old: ModelOutput | None, method_name: str) -> ModelOutput:
    """The parent's output, or a clear error when a parent-aligned method runs without one."""
    if ctx_old is None:
        raise ValueError(f"method {method_name!r} needs the parent generation's output")
    return ctx_old

