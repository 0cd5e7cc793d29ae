"""``bct``: Backward-Compatible Training's influence loss through the frozen old classifier."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.methods.base import TrainContext
from orchestrator.methods.common import SupervisedMethod, class_means, require_parent
from orchestrator.methods.descriptions import BCTDescription
from orchestrator.methods.registry import register_method
from orchestrator.models.outputs import ModelOutput


@register_method
class BCT(BCTDescription, SupervisedMethod):
    """L = CE(W_new·φ_n(x), y) + λ·CE(W_old·φ_n(x), y)  (Shen et al. 2020; hbct.md §13).

    Classes the old model never saw (not in its ``seen_classes``, or beyond its head) get old
    classifier rows synthesised as in the original BCT: the mean old-model embedding of the
    class over this generation's training set, bias 0. Decision (open in hbct.md §15.20): each
    synthesised row is rescaled to the mean norm of the old model's trained rows, so that
    synthesised and trained logits are on one scale. The influence loss runs on every sample.
    """

    def on_train_start(self, ctx: TrainContext) -> None:
        if ctx.old_model is None:
            raise ValueError("bct needs a parent generation")
        head = ctx.old_model.head
        if not hasattr(head, "weight"):
            raise ValueError(f"bct needs a linear old classifier, the parent has {type(head).__name__}")
        old_weight = head.weight.detach()
        old_bias = getattr(head, "bias", None)
        old_bias = old_bias.detach() if old_bias is not None else torch.zeros(old_weight.shape[0])
        seen = torch.zeros(ctx.num_classes, dtype=torch.bool)
        known = ctx.old_model.seen_classes.cpu()
        known = known[known < min(ctx.num_classes, old_weight.shape[0])]
        seen[known] = True

        old_out, labels = ctx.embed_train_data(ctx.old_model)
        means, present = class_means(old_out.embedding, labels, ctx.num_classes)
        weight = torch.zeros(ctx.num_classes, old_weight.shape[1], device=ctx.device)
        bias = torch.zeros(ctx.num_classes, device=ctx.device)
        rows = torch.nonzero(seen).flatten().to(ctx.device)
        weight[rows] = old_weight.to(ctx.device)[rows]
        bias[rows] = old_bias.to(ctx.device)[rows]
        missing = (~seen.to(ctx.device)) & present
        if missing.any():
            trained_norm = old_weight[known].norm(dim=1).mean() if known.numel() else torch.tensor(1.0)
            weight[missing] = F.normalize(means[missing], dim=1) * trained_norm.to(ctx.device)
        ctx.state["bct_old_classifier"] = (weight, bias)

    def loss(self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx: TrainContext) -> dict[str, torch.Tensor]:
        require_parent(old, self.name)
        weight, bias = ctx.state["bct_old_classifier"]
        influence = F.cross_entropy(F.linear(new.embedding, weight, bias), labels)
        return {"base": self.base_loss(new, labels), "influence": self.params.lam * influence}
