"""``dsimplex``: stationary representations with the fixed d-Simplex classifier (d-Simplex-HOC).

stationary_dsimplex.md §4-§6: every generation trains against the same fixed, pre-allocated
d-Simplex W (K prototypes in R^(K-1)); with a parent it adds the HOC InfoNCE term (eq. 3).
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from orchestrator import limits
from orchestrator.geometry.spaces import Space
from orchestrator.methods.base import CompatibilityMethod, MethodParams, TrainContext
from orchestrator.methods.hoc import hoc_infonce
from orchestrator.methods.registry import register_method
from orchestrator.models.heads import DSimplexHead, dsimplex_finetune_targets
from orchestrator.models.lifts import EuclideanLift
from orchestrator.models.outputs import ModelOutput


class DSimplexParams(MethodParams):
    """Hyperparameters of d-Simplex(-HOC) (stationary_dsimplex.md §4, §5, §7.3).

    num_prototypes:   K, the number of pre-allocated prototypes; the embedding must be K − 1
                      dimensional. The paper uses K = 1024; None means embed_dim + 1.
    normalization:    ``unit`` rows (released code, default) or ``frobenius`` (paper App. D, rows
                      of norm 1/√K) — §11 item 1.
    lam:              weight λ of the stationary CE in L_HOC (1 − λ goes to InfoNCE), eq. 3.
    tau:              the factor that MULTIPLIES the cosine in InfoNCE (inverse temperature), eq. 5.
    class_assignment: ``right_to_left`` maps class y to prototype K − 1 − y (fine-tuning classes,
                      §4.3, the code's ``target = K − 1 − y``); ``left_to_right`` maps y to y
                      (pre-training classes). Every generation of one lineage must keep the index
                      sets it uses disjoint from those of models it replaces.
    """

    num_prototypes: int | None = Field(None, ge=2, le=limits.MAX_CLASSES)
    normalization: Literal["unit", "frobenius"] = "unit"
    lam: float = Field(0.1, ge=0, le=1)
    tau: float = Field(10.0, gt=0)
    class_assignment: Literal["right_to_left", "left_to_right"] = "right_to_left"


class UnnormalizedCosineLift(EuclideanLift):
    """Identity lift (features = embedding = z, (B, K−1)) whose embeddings are searched by cosine.

    The d-Simplex logits are W z on the raw z — no normalisation, no scale (§4.2) — while the
    released code L2-normalises z at evaluation. Cosine distance is scale invariant, so storing
    raw z and ranking it by ``1 − cos`` is exactly that evaluation, and it stays comparable with
    the (unit-norm) embeddings of a ``CosineLift`` generation.
    """

    space = Space.COSINE


def prototype_targets(
    labels: torch.Tensor, num_prototypes: int, class_assignment: str = "right_to_left"
) -> torch.Tensor:
    """Class ids (B,) in [0, K) → d-Simplex prototype indices (B,) (stationary_dsimplex.md §4.3).

    ``right_to_left``: y → K − 1 − y (fine-tuning classes); ``left_to_right``: y → y (pre-training).
    """
    if class_assignment == "right_to_left":
        return dsimplex_finetune_targets(labels, num_prototypes)
    if class_assignment != "left_to_right":
        raise ValueError(
            f"class_assignment must be 'right_to_left' or 'left_to_right', got {class_assignment!r}"
        )
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_prototypes):
        raise ValueError(
            f"labels must lie in [0, {num_prototypes - 1}], got range [{int(labels.min())}, {int(labels.max())}]"
        )
    return labels


@register_method
class DSimplex(CompatibilityMethod):
    """Stationary d-Simplex training; L = λ·CE + (1 − λ)·InfoNCE with a parent (eq. 3), CE alone without.

    CE (eq. 2) is softmax cross-entropy over ALL K logits of the fixed head with the mapped
    targets: prototypes of classes not yet seen (the "future" ones) stay in the denominator, so
    their regions stay free. Batch mean, as in the code (the paper writes a sum).

    The HOC term is ``hoc_infonce`` — the released code version (§5.4): old embedding as anchor,
    the new batch as contrast set, same-class logits set to 0 (not removed).

    Decisions:
    - Without a parent the objective is the stationary CE alone, unweighted (``{"base": CE}``):
      λ only balances CE against InfoNCE, and scaling a lone CE by λ = 0.1 would just divide the
      learning rate by 10. A first generation (or a third-party replacement pre-trained with
      L_SCE, §6.1) is trained this way.
    - Space: cosine. The lift is the identity (``UnnormalizedCosineLift``) because the head needs
      the raw z (§4.2), and retrieval ranks by cosine, as the code L2-normalises at evaluation.
    - The head's ``num_classes`` is K (all prototypes), so a ``TrainContext`` built from the model
      reports K; the labels of a generation only need to lie in [0, num_classes of its data) ⊆ [0, K).

    Multi-step sequences with model replacements work because every generation builds the same
    K and normalisation, hence bit-identical prototypes: the classifier never moves, and classes
    learned later cannot displace earlier ones (Theorem 1, stationarity ⟹ compatibility). Each
    generation (incl. a replacement) must therefore use the same K, embed_dim = K − 1, and
    disjoint prototype index sets for pre-training and fine-tuning classes.
    """

    name = "dsimplex"
    summary = "fixed d-Simplex classifier (stationary CE over all K prototypes) + HOC InfoNCE to the parent"
    Params = DSimplexParams
    requires_parent = False
    requires_parent_embed_dim = True  # the same K (embed_dim = K - 1); InfoNCE between old and new embeddings
    replacement_keeps_parent_embed_dim = True  # one fixed classifier (K prototypes) for the whole chain

    @property
    def space(self) -> Space:
        return Space.COSINE

    def build_lift(self) -> nn.Module:
        return UnnormalizedCosineLift()

    def num_prototypes(self, embed_dim: int) -> int:
        """K for an encoder of ``embed_dim``: the configured value, or embed_dim + 1."""
        return self.params.num_prototypes if self.params.num_prototypes is not None else embed_dim + 1

    def check_embed_dim(self, embed_dim: int) -> None:
        """The d-Simplex of K prototypes lives in R^(K−1): embed_dim must be num_prototypes − 1."""
        k = self.num_prototypes(embed_dim)
        if embed_dim != k - 1:
            raise ValueError(f"dsimplex needs embed_dim == num_prototypes - 1 = {k - 1} (num_prototypes {k})")

    def build_head(self, embed_dim: int, num_classes: int) -> nn.Module:
        """The fixed d-Simplex head (K prototypes of dimension K − 1), with no trainable parameter."""
        try:
            self.check_embed_dim(embed_dim)
        except ValueError as error:
            raise ValueError(f"{error}, got embed_dim={embed_dim}") from None
        k = self.num_prototypes(embed_dim)
        if num_classes > k:
            raise ValueError(
                f"dsimplex: num_classes={num_classes} exceeds num_prototypes={k}; pre-allocate more prototypes"
            )
        return DSimplexHead(k, in_dim=embed_dim, normalization=self.params.normalization)

    def stationary_ce(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Eq. 2: CE over all K logits (B, K) with targets ``prototype_targets(labels)``, batch mean."""
        targets = prototype_targets(labels, logits.shape[1], self.params.class_assignment)
        return F.cross_entropy(logits, targets)

    def loss(
        self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx: TrainContext
    ) -> dict[str, torch.Tensor]:
        ce = self.stationary_ce(new.logits, labels)
        if old is None:
            return {"base": ce}
        if old.embedding.shape[1] != new.embedding.shape[1]:
            raise ValueError(
                "dsimplex: the parent's embedding dimension must equal this generation's (same K), got "
                f"old {old.embedding.shape[1]} and new {new.embedding.shape[1]}"
            )
        lam = self.params.lam
        return {
            "base": lam * ce,
            "infonce": (1.0 - lam) * hoc_infonce(old.embedding, new.embedding, labels, self.params.tau),
        }
