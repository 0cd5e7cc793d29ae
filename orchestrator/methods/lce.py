"""``lce``: Learning Compatible Embeddings (Meng et al., ICCV 2021), as benchmarked by AdvBCT.

LCE aligns the class centres of the two models and keeps each new class inside the boundary the
old model drew around it. Spec: prototype_perturbation.md §11 ("LCE and UniBCT replace the
softmax loss with ArcFace loss to regularize the new model"); the boundary term and the radii are
the ones of the AdvBCT benchmark code (``Ashespt/AdvBCT``, ``COMP_LOSS.TYPE: lce``, ``K = 0``:
no transformation module on the old model, as in LCE's protocol there).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.methods.base import TrainContext
from orchestrator.methods.common import (
    SupervisedMethod,
    arcface_logits,
    iqr_class_radii,
    normalized_class_means,
    parent_train_embeddings,
    require_parent,
    seen_class_mask,
)
from orchestrator.methods.descriptions import LCEDescription, LCEParams
from orchestrator.methods.registry import register_method
from orchestrator.models.outputs import ModelOutput

__all__ = ["LCE", "LCEParams", "angular_boundary_loss", "arcface_logits", "old_class_geometry"]

CENTRES, PRESENT, RADII, BOUNDED = "lce/centres", "lce/present", "lce/radii", "lce/bounded"


def old_class_geometry(
    old_embeddings: torch.Tensor, labels: torch.Tensor, num_classes: int, iqr_factor: float = 1.5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Old class centres and angular radii (the benchmark's ``gen_class_theta``).

    old_embeddings: (N, d) old-model embeddings of the training items; labels (N,).
    Centre c_k: mean of the L2-normalised embeddings of class k, re-normalised (``normalized_class_means``).
    Angle of item i: θ_i = arccos(ê_i · c_{y_i}); radius θ_k: the largest angle of class k after
    the 1.5·IQR fence (``iqr_class_radii``).
    Returns ``(centres (C, d) unit or 0, present (C,) bool, radii (C,), inliers (C,) int64)``.
    """
    centres, present = normalized_class_means(old_embeddings, labels, num_classes)
    cosine = (F.normalize(old_embeddings, dim=1) * centres[labels]).sum(dim=1)
    angles = torch.arccos(cosine.clamp(-1.0, 1.0))
    radii, inliers = iqr_class_radii(angles, labels, num_classes, iqr_factor)
    return centres, present, radii, inliers


def angular_boundary_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    centres: torch.Tensor,
    radii: torch.Tensor,
    bounded: torch.Tensor,
) -> torch.Tensor:
    """LCE's boundary term: new embeddings stay within the old class's angular radius.

    embeddings: (B, d) new embeddings; labels (B,); centres (C, d) unit old centres c_k;
    radii (C,) old angular radii θ_k; bounded (C,) bool, the classes that have a boundary.
    loss = mean over i with bounded[y_i] of max(0, arccos(ê_i · c_{y_i}) − θ_{y_i}); 0 when the batch
    has no such item (as the benchmark: the mean runs over every bounded item, inside or not).
    """
    cosine = (F.normalize(embeddings, dim=1) * centres[labels]).sum(dim=1)
    # the clamp keeps arccos' gradient finite; a violating item is never that close to its centre
    angles = torch.arccos(cosine.clamp(-1.0 + 1e-6, 1.0 - 1e-6))
    active = bounded.to(embeddings.device)[labels].to(embeddings.dtype)
    excess = F.relu(angles - radii[labels])
    return (excess * active).sum() / active.sum().clamp(min=1.0)


@register_method
class LCE(LCEDescription, SupervisedMethod):
    """L = CE(W_n·φ_n(x), y) + λ·CE(ArcFace_{s,m}(φ_n(x); C_o), y) + μ·L_boundary.

    C_o (C, d): old class centres, the normalised mean old embedding of each class over this
    generation's training set (``old_class_geometry``), frozen for the whole training.
    L_boundary: ``angular_boundary_loss`` against the old angular radii θ_k.

    Decision (open: spec §11 gives only the ArcFace sentence): LCE's "alignment of class centres"
    is the ArcFace term with the old centres as the (frozen) classifier. The benchmark code
    instead pulls the rows of the new softmax classifier towards the old centres (1 − cos); with
    a linear head with bias that constrains where the embeddings go only loosely, whereas the
    ArcFace term acts on the embeddings themselves and is the form the spec names.
    Decision (unseen classes, as ``bct``): a class the old model never saw gets its centre from
    the old model's embeddings of its images (BCT's synthesised row) and takes part in the ArcFace
    term, which ties it to that synthesised centre. It gets no boundary (the old model never drew
    one; ``advbct``, whose boundary is its only per-class term, synthesises one instead), so the
    boundary covers the old model's ``seen_classes`` with at least two items inside the fence
    (the benchmark skips classes whose radius list has one entry). Classes without training
    images get no centre (−inf logits).
    """

    def on_train_start(self, ctx: TrainContext) -> None:
        old_out, labels = parent_train_embeddings(ctx, self.name)
        centres, present, radii, inliers = old_class_geometry(
            old_out.embedding, labels, ctx.num_classes, self.params.iqr_factor
        )
        bounded = seen_class_mask(ctx.old_model, ctx.num_classes, centres.device) & present & (inliers >= 2)
        ctx.state.update({CENTRES: centres, PRESENT: present, RADII: radii, BOUNDED: bounded})

    def loss(self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx: TrainContext) -> dict[str, torch.Tensor]:
        require_parent(old, self.name)
        centres, present = ctx.state[CENTRES], ctx.state[PRESENT]
        logits = arcface_logits(new.embedding, centres, labels, self.params.scale, self.params.margin, present)
        boundary = angular_boundary_loss(new.embedding, labels, centres, ctx.state[RADII], ctx.state[BOUNDED])
        return {
            "base": self.base_loss(new, labels),
            "arcface": self.params.lam * F.cross_entropy(logits, labels),
            "boundary": self.params.boundary_weight * boundary,
        }
