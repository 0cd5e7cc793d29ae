"""Pieces several methods share: the supervised base objective, class means, ArcFace logits and
outlier-fenced class radii."""
from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.geometry.spaces import Space
from orchestrator.methods.base import CompatibilityMethod, TrainContext
from orchestrator.methods.descriptions import FlatDescription
from orchestrator.metrics.class_means import class_mean_distances as whole_gallery_class_mean_distances
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.heads import LinearHead, LorentzMLR
from orchestrator.models.lifts import build_lift
from orchestrator.models.outputs import ModelOutput


class SupervisedMethod(FlatDescription, CompatibilityMethod):
    """A method whose base objective is softmax cross-entropy through its own trainable head.

    Heads: a linear softmax classifier for flat spaces (BCT's setting; hbct.md §13 leaves the
    Euclidean head open, decision: linear with bias), the Lorentz MLR for the Lorentz space.
    """

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


def class_mean_distances(
    forward_old_embeddings: torch.Tensor, labels: torch.Tensor, distance: Literal["l2", "cosine"] = "l2"
) -> torch.Tensor:
    """Per-item distance (N,) float64 of F(h_i^k) to its class mean μ_{y_i} (lambda_orthogonality.md
    §2.11): the backfill priority, for ``lambda_orth.backfill_order`` (the pipeline's
    ``class_mean_distance`` order computes the same distances shard by shard, ``backfill.orders``).

    forward_old_embeddings: (N, n) the forward-adapted gallery F(h_k); labels: (N,) class ids.
    The one implementation is ``metrics.class_means`` (also what the shard-by-shard backfill
    scoring computes); this is its torch face, without gradients.
    """
    if forward_old_embeddings.dim() != 2 or labels.shape != (forward_old_embeddings.shape[0],):
        raise ValueError(
            "forward_old_embeddings must be (N, n) and labels (N,), got "
            f"{tuple(forward_old_embeddings.shape)} and {tuple(labels.shape)}"
        )
    gap = whole_gallery_class_mean_distances(forward_old_embeddings.detach().double().cpu().numpy(),
                                             labels.cpu().numpy(), distance)
    return torch.from_numpy(gap).to(forward_old_embeddings.device)


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


def check_parent_geometry(method_name: str, old_model: CompatibleModel, space: Space, curv: float) -> None:
    """Raise ValueError unless the parent generation lives in ``space`` with curvature ``curv``
    (relative tolerance 1e-6): a method that compares the two generations' embeddings directly
    in one space (HBCT's entailment cones, the binary hyperbolic codes) needs both."""
    if old_model.space is not space:
        raise ValueError(f"{method_name}: the parent generation must live in the {space.value} space "
                         f"(this generation: {space.value}), got {old_model.space.value}")
    if not math.isclose(old_model.curv, curv, rel_tol=1e-6, abs_tol=0.0):
        raise ValueError(f"{method_name}: the parent's curvature must equal this generation's: "
                         f"parent curv={old_model.curv!r}, new curv={curv!r}")


def arcface_logits(
    embeddings: torch.Tensor,
    weights: torch.Tensor,
    labels: torch.Tensor,
    scale: float,
    margin: float,
    present: torch.Tensor | None = None,
) -> torch.Tensor:
    """ArcFace logits (additive angular margin, Deng et al. 2019), as the LCE / UniBCT baselines use them.

    embeddings: (B, d) points (L2-normalised here).
    weights:    (C, d) class directions, e.g. old prototypes (L2-normalised here; zero rows stay 0).
    labels:     (B,) int64 targets in [0, C).
    scale, margin: s and m.
    present:    optional (C,) bool; columns of classes marked False are −inf (no prototype).

    With cos θ_ij = ê_i · ŵ_j:  logits_ij = s · cos(θ_ij + m) for j = y_i, s · cos θ_ij otherwise,
    so m = 0 gives the scaled cosine softmax. The target is computed as cos θ·cos m − sin θ·sin m
    (exact, sin θ = √(1 − cos²θ) ≥ 0 on [0, π]). Decision (the released code adds m to the angle
    unguarded): the target angle is capped at π, i.e. the target logit is −s once θ > π − m, so it
    never grows again as the embedding turns further away (continuous, non-increasing in θ).
    Returns (B, C).
    """
    if labels.shape != (embeddings.shape[0],):
        raise ValueError(f"labels must have shape ({embeddings.shape[0]},), got {tuple(labels.shape)}")
    if embeddings.shape[1] != weights.shape[1]:
        raise ValueError(f"embeddings have dimension {embeddings.shape[1]}, class weights {weights.shape[1]}: "
                         "new and old embedding dimensions must match")
    cosine = F.normalize(embeddings, dim=1) @ F.normalize(weights, dim=1).T  # (B, C)
    target = cosine.gather(1, labels.unsqueeze(1)).clamp(-1.0, 1.0)
    # sin θ; the floor keeps the gradient finite at θ = 0 (cos θ = 1)
    sine = (1.0 - target * target).clamp_min(1e-12).sqrt()
    shifted = target * math.cos(margin) - sine * math.sin(margin)
    shifted = torch.where(target > -math.cos(margin), shifted, torch.full_like(shifted, -1.0))
    logits = cosine.scatter(1, labels.unsqueeze(1), shifted) * scale
    if present is not None:
        logits = logits.masked_fill(~present.to(logits.device).unsqueeze(0), float("-inf"))
    return logits


def iqr_class_radii(
    distances: torch.Tensor, labels: torch.Tensor, num_classes: int, iqr_factor: float = 1.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class radius: the largest distance of a class's items after Tukey's outlier fence.

    distances: (N,) each item's distance (angle, chord, ...) to its class centre; labels (N,).
    As the AdvBCT benchmark's old-class "meta" (its ``extract_feat.py``): a class's distances are
    sorted, q1 = r[⌊n/4⌋], q3 = r[⌊3n/4⌋] (n ≥ 4 items, else no filtering), items outside
    [q1 − f·IQR, q3 + f·IQR] are dropped, the radius is the largest remaining distance.
    Returns ``(radii (num_classes,), inliers (num_classes,) int64)``; classes without items: 0, 0.
    """
    radii = torch.zeros(num_classes, dtype=distances.dtype, device=distances.device)
    inliers = torch.zeros(num_classes, dtype=torch.long, device=distances.device)
    for c in torch.unique(labels).tolist():
        values = torch.sort(distances[labels == c]).values
        n = values.numel()
        if n >= 4:
            q1, q3 = values[n // 4], values[(3 * n) // 4]
            spread = q3 - q1
            values = values[(values >= q1 - iqr_factor * spread) & (values <= q3 + iqr_factor * spread)]
        radii[c] = values.max()
        inliers[c] = values.numel()
    return radii, inliers


def seen_class_mask(old_model: CompatibleModel, num_classes: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(num_classes,) bool: the classes the old model was trained on (its ``seen_classes`` buffer)."""
    seen = torch.zeros(num_classes, dtype=torch.bool, device=device)
    known = old_model.seen_classes.to(device)
    seen[known[(known >= 0) & (known < num_classes)]] = True
    return seen


def parent_train_embeddings(ctx: TrainContext, method_name: str) -> tuple[ModelOutput, torch.Tensor]:
    """The frozen parent's outputs on the training set (no augmentation): ``(old (N, ·), labels (N,))``,
    what old class centres and prototypes are computed from. ValueError naming ``method_name`` when
    the generation has no parent."""
    if ctx.old_model is None:
        raise ValueError(f"{method_name} needs a parent generation")
    return ctx.embed_train_data(ctx.old_model)


def paired_train_embeddings(ctx: TrainContext, method_name: str) -> tuple[ModelOutput, ModelOutput, torch.Tensor]:
    """The frozen parent's and the trained model's outputs on the training set (no augmentation),
    item by item: ``(old (N, ·), new (N, ·), labels (N,))`` — the data adapter stages fit on.
    ValueError naming ``method_name`` when there is no parent or the two passes disagree on order."""
    old_out, old_labels = parent_train_embeddings(ctx, method_name)
    new_out, new_labels = ctx.embed_train_data(ctx.new_model)
    if not torch.equal(old_labels, new_labels):
        raise ValueError(f"{method_name}: the parent and the new model saw the training items in different orders")
    return old_out, new_out, new_labels
