"""``dsimplex``: stationary representations with the fixed d-Simplex classifier (d-Simplex-HOC).

stationary_dsimplex.md §4-§6: every generation trains against the same fixed, pre-allocated
d-Simplex W (K prototypes in R^(K-1)); with a parent it adds the HOC InfoNCE term (eq. 3).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.geometry.spaces import Space
from orchestrator.methods.base import CompatibilityMethod, TrainContext
from orchestrator.methods.descriptions import DSimplexDescription
from orchestrator.methods.hoc import hoc_infonce
from orchestrator.methods.registry import register_method
from orchestrator.models.heads import DSimplexHead, dsimplex_finetune_targets
from orchestrator.models.lifts import EuclideanLift
from orchestrator.models.outputs import ModelOutput


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
class DSimplex(DSimplexDescription, CompatibilityMethod):
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

    def build_lift(self) -> nn.Module:
        return UnnormalizedCosineLift()


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
