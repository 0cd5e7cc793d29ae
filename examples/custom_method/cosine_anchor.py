"""``cosine_anchor``: a compatibility method written outside the package, in one file.

    L = CE(new head) + λ · mean_i (1 − cos(φ_new(x_i), φ_old(x_i)))

The cross-entropy trains the new model's own classifier; the second term pulls every new
embedding towards the frozen parent's embedding of the same image, so the new model's queries
can be searched against the old model's gallery. It is the cosine cousin of the built-in ``l2``
baseline (CE + λ‖φ_n − φ_o‖²) and needs the same embedding size as the parent.

How a method plugs in (the whole protocol is ``orchestrator/methods/base.py``):

* subclass ``CompatibilityMethod`` (here ``SupervisedMethod``, which supplies the flat space,
  the linear softmax head and ``base_loss``) and set ``name``, ``summary`` and ``Params``;
* ``Params`` is a pydantic model (subclass of ``FlatParams``: ``space`` cosine | euclidean) with
  typed, defaulted fields — pipeline YAML, Tune and ``orchestrator methods`` validate against it;
* ``loss`` returns named, already-weighted terms whose sum is minimised (each is logged);
* ``@register_method`` adds the class to the registry when this module is imported.

Every process that looks the method up by name must import this module: the driver (``run.py``
imports it) and every Ray Train worker, which finds it through ``ORCHESTRATOR_PLUGINS`` (see
``orchestrator/methods/registry.py`` and ``run.py``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from orchestrator.methods.common import SupervisedMethod, require_parent
from orchestrator.methods.descriptions import FlatParams
from orchestrator.methods.registry import register_method
from orchestrator.models.outputs import ModelOutput


class CosineAnchorParams(FlatParams):
    """lam: weight λ ≥ 0 of the cosine anchor term (0 is plain cross-entropy, an unaligned model);
    space: cosine (default) or euclidean retrieval, inherited from ``FlatParams``."""

    lam: float = Field(1.0, ge=0)


def cosine_anchor_loss(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """mean_i (1 − cos(new_i, old_i)) of two (B, d) embedding batches; 0 when aligned, ≤ 2."""
    return (1.0 - F.cosine_similarity(new, old, dim=1)).mean()


@register_method
class CosineAnchor(SupervisedMethod):
    """CE + λ·(1 − cos(φ_new, φ_old)): each new embedding anchored to its parent's embedding."""

    name = "cosine_anchor"
    summary = "CE + λ·mean(1 − cos(new, old)): new embeddings anchored to the parent's (example plug-in)"
    Params = CosineAnchorParams
    requires_parent = True  # the anchor term needs the parent's output; a first generation cannot use it
    requires_parent_embed_dim = True  # compares new and old vectors: a child of another embed_dim is refused at load

    def loss(self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx) -> dict[str, torch.Tensor]:
        old = require_parent(old, self.name)
        if new.embedding.shape[1] != old.embedding.shape[1]:
            raise ValueError(f"{self.name}: the new embedding size {new.embedding.shape[1]} differs from the "
                             f"parent's {old.embedding.shape[1]}; give both generations the same embed_dim")
        return {
            "base": self.base_loss(new, labels),
            "anchor": self.params.lam * cosine_anchor_loss(new.embedding, old.embedding),
        }
