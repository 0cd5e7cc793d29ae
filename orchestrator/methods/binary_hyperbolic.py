"""``binary_hyperbolic``: supervised Poincaré embeddings trained towards fixed class prototypes.

binary_hyperbolic.md §3 / App. B: f(x) = exp_0^c(W·backbone(x)) in the Poincaré ball of curvature −c,
p(y | x) = softmax_y(−d_c(f(x), p_y)) over fixed, maximally separated prototypes (regular-simplex
vertices, Kasarla et al. 2022) at radius r. The post-hoc binariser is a retrieval concern, not a
training one, so it does not appear here.

Lifelong compatibility comes from the prototypes, not from an alignment loss: they are
deterministic and pre-allocated for ``num_prototypes`` classes, so every generation built with the
same ``num_prototypes``, ``prototype_radius`` and ``curv`` pulls class y towards the same anchor.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.geometry import poincare
from orchestrator.geometry.spaces import Space
from orchestrator.methods.base import CompatibilityMethod, TrainContext
from orchestrator.methods.common import check_parent_geometry
from orchestrator.methods.descriptions import BinaryHyperbolicDescription
from orchestrator.methods.registry import register_method
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.heads import PoincarePrototypeHead, simplex_prototypes_in_ball
from orchestrator.models.lifts import build_lift
from orchestrator.models.outputs import ModelOutput


@register_method
class BinaryHyperbolic(BinaryHyperbolicDescription, CompatibilityMethod):
    """L = CE(−d_c(f(x), p_·)/T, y) [+ λ·mean d_c(h_n, h_o) with a parent] (binary_hyperbolic.md §3).

    Decisions:
    * prototypes: the one-vs-rest (no hierarchy) maximally separated prototypes, i.e. the regular
      simplex of ``simplex_prototypes_in_ball`` zero-padded to embed_dim; the hierarchical
      entailment-cone prototypes need a label hierarchy the pipeline does not have;
    * r² is read as the squared Euclidean norm of the prototypes in the ball of curvature −c
      (A2, first reading), so r must be < 1/√c — the "–" cells of Tables 4/10;
    * prototype positions are computed from K = ``num_prototypes`` and the head holds the first
      ``num_classes`` of them: class y always gets row y of the same K-simplex; the softmax runs
      over this generation's classes only (leaf classes, A7), so ``head.num_classes`` stays the
      generation's label-space size;
    * temperature 1.0 (no scaling of −d_c is stated, A7);
    * lam = 0.0 by default: with shared fixed prototypes no alignment term is needed; when set,
      the term is the mean Poincaré distance between new and (detached) old embeddings;
    * a parent must be a Poincaré model with the same curvature and the same prototypes for its
      classes (otherwise the anchors moved and the generations are not compatible): ValueError.
    """

    def build_lift(self) -> nn.Module:
        return build_lift(Space.POINCARE, curv=self.params.curv, clip=self.params.clip)

    def prototypes(self, embed_dim: int, num_classes: int) -> torch.Tensor:
        """The first ``num_classes`` of the K pre-allocated prototypes, (num_classes, embed_dim) float32."""
        total = self.params.num_prototypes if self.params.num_prototypes is not None else num_classes
        if total < num_classes:
            raise ValueError(
                f"num_prototypes must be >= num_classes of the generation: num_prototypes={total}, "
                f"num_classes={num_classes}"
            )
        if embed_dim < total - 1:
            raise ValueError(
                f"embed_dim must be >= num_prototypes - 1 for simplex prototypes: embed_dim={embed_dim}, "
                f"num_prototypes={total}"
            )
        return simplex_prototypes_in_ball(total, embed_dim, self.params.prototype_radius)[:num_classes]

    def build_head(self, embed_dim: int, num_classes: int) -> nn.Module:
        return PoincarePrototypeHead(self.prototypes(embed_dim, num_classes), curv=self.params.curv)

    def check_parent(self, old_model: CompatibleModel, new_model: CompatibleModel) -> None:
        """Raise ValueError unless the parent shares the space, the curvature and the class anchors."""
        check_parent_geometry("binary_hyperbolic", old_model, Space.POINCARE, self.params.curv)
        old_protos = getattr(old_model.head, "prototypes", None)
        new_protos = new_model.head.prototypes
        if old_protos is None or old_protos.shape[1] != new_protos.shape[1]:
            raise ValueError(
                "binary_hyperbolic: the parent must have a PoincarePrototypeHead with the same embedding "
                f"dimension {new_protos.shape[1]}, got {type(old_model.head).__name__}"
                + ("" if old_protos is None else f" with dimension {old_protos.shape[1]}")
            )
        shared = min(old_protos.shape[0], new_protos.shape[0])
        if not torch.equal(old_protos[:shared].cpu(), new_protos[:shared].cpu()):
            raise ValueError(
                "binary_hyperbolic: the parent's prototypes differ from this generation's for the shared "
                f"classes 0..{shared - 1}; use the same num_prototypes and prototype_radius in every generation"
            )

    def on_train_start(self, ctx: TrainContext) -> None:
        if ctx.old_model is not None:
            self.check_parent(ctx.old_model, ctx.new_model)

    def loss(self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx: TrainContext) -> dict[str, torch.Tensor]:
        """``base``: CE over logits −d_c / temperature; ``alignment`` (λ-weighted) when a parent's
        output is given and lam > 0."""
        terms = {"base": F.cross_entropy(new.logits / self.params.temperature, labels)}
        if old is not None and self.params.lam > 0:
            h_old = old.embedding.detach()
            if h_old.shape != new.embedding.shape:
                raise ValueError(
                    f"binary_hyperbolic: new and old embeddings must have the same shape, got "
                    f"{tuple(new.embedding.shape)} and {tuple(h_old.shape)}"
                )
            alignment = poincare.distance(new.embedding, h_old, self.params.curv).mean()
            terms["alignment"] = self.params.lam * alignment
        return terms
