"""``unibct``: Universal Backward-Compatible Training (Zhang et al., IJCAI 2022).

The new model is regularised by an ArcFace loss whose classifier is the old model's class
prototypes, for every class of the new training set (the "universal" setting: the old model also
embeds the classes it never saw). The prototypes are refined structurally first: knowledge is
propagated among neighbouring intra-class old embeddings, so that outliers, frequent among old
embeddings of classes the old model never learned, move the prototypes less
(prototype_perturbation.md §11). ArcFace s, m are the AdvBCT benchmark's (``Ashespt/AdvBCT``,
``COMP_LOSS.TYPE: uni_bct``); that code does not release the refinement, so its form here is a
documented decision (``structural_prototypes``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.methods.base import TrainContext
from orchestrator.methods.common import SupervisedMethod, arcface_logits, parent_train_embeddings, require_parent
from orchestrator.methods.descriptions import UniBCTDescription, UniBCTParams
from orchestrator.methods.registry import register_method
from orchestrator.models.outputs import ModelOutput

__all__ = ["UniBCT", "UniBCTParams", "arcface_logits", "intra_class_graph", "structural_prototypes"]

PROTOTYPES, PRESENT = "unibct/prototypes", "unibct/present"


def intra_class_graph(
    members: torch.Tensor, neighbours: int, temperature: float, chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k-nearest-neighbour graph of one class's unit embeddings, as a row-stochastic matrix.

    members: (n, d) L2-normalised embeddings of one class, n ≥ 2.
    Node i's neighbours N(i): the k = min(neighbours, n − 1) other members most cosine-similar to
    it (itself excluded); edge weights P_ij = exp(cos_ij / τ) / Σ_{j'∈N(i)} exp(cos_ij' / τ).
    Returns ``(index (n, k) int64, weight (n, k))``, each row of weight summing to 1.
    ``chunk_size`` rows of the (chunk, n) similarity matrix are built at a time (memory bound).
    """
    n = members.shape[0]
    if n < 2:
        raise ValueError(f"intra_class_graph needs at least 2 members, got {n}")
    k = min(neighbours, n - 1)
    indices, weights = [], []
    for start in range(0, n, chunk_size):
        block = members[start:start + chunk_size]
        similarity = block @ members.T  # (b, n)
        rows = torch.arange(block.shape[0], device=members.device)
        similarity[rows, rows + start] = float("-inf")  # no self-loop
        top, index = similarity.topk(k, dim=1)
        indices.append(index)
        weights.append(torch.softmax(top / temperature, dim=1))
    return torch.cat(indices), torch.cat(weights)


def structural_prototypes(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    neighbours: int = 10,
    temperature: float = 0.1,
    steps: int = 1,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Structurally refined class prototypes of old embeddings.

    embeddings: (N, d) old-model embeddings; labels (N,) in [0, num_classes).
    For each class k with members F⁰ (n_k, d) (L2-normalised embeddings) and the graph P of
    ``intra_class_graph``:  F^{t+1} = P F^t for t < T, then  p_k = normalise(mean_i F^T_i).
    One step replaces every member by the similarity-weighted mean of its k nearest class-mates,
    so an outlier (i) is replaced by its neighbours and (ii) is rarely anyone's neighbour, and
    when it is, its weight is small: it moves p_k less than it moves the plain mean. A class with
    one member keeps it. T = 0 gives ``normalized_class_means``.

    Decisions (spec §11 only says "propagates knowledge among neighbouring intra-class old samples
    to reduce outliers' effect on prototypes"; the benchmark code releases no refinement):
    within-class kNN graph on cosine similarity without self-loops (a self-loop of weight
    exp(1/τ) would let an outlier keep itself), softmax weights with temperature τ (never an
    all-zero row, unlike clamped cosine weights), a fixed graph across steps, no
    re-normalisation between steps (a linear random-walk smoothing), one step by default.
    Returns ``(prototypes (num_classes, d) unit rows or 0 for classes without items, present (num_classes,) bool)``.
    """
    if neighbours < 1 or not temperature > 0 or steps < 0:
        raise ValueError(f"invalid refinement settings: neighbours={neighbours}, temperature={temperature}, steps={steps}")
    if labels.numel() and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"structural_prototypes: labels must lie in [0, {num_classes})")
    unit = F.normalize(embeddings, dim=1)
    prototypes = torch.zeros(num_classes, embeddings.shape[1], dtype=embeddings.dtype, device=embeddings.device)
    present = torch.zeros(num_classes, dtype=torch.bool, device=embeddings.device)
    for c in torch.unique(labels).tolist():
        refined = unit[labels == c]
        if refined.shape[0] >= 2 and steps > 0:
            index, weight = intra_class_graph(refined, neighbours, temperature, chunk_size)
            for _ in range(steps):
                refined = torch.einsum("nk,nkd->nd", weight, refined[index])
        prototypes[c] = F.normalize(refined.mean(dim=0), dim=0)
        present[c] = True
    return prototypes, present


@register_method
class UniBCT(UniBCTDescription, SupervisedMethod):
    """L = CE(W_n·φ_n(x), y) + λ·CE(ArcFace_{s,m}(φ_n(x); P_o), y).

    P_o (C, d): ``structural_prototypes`` of the frozen parent's embeddings of this generation's
    training set, computed once before training (the parent does not change).
    Decision (unseen classes, as ``bct`` synthesises old classifier rows from old class means):
    every class with training images has a prototype, seen by the old model or not (UniBCT's
    universal setting, where old prototypes of new classes are what it refines), and the ArcFace
    term runs on every sample; classes without training images have none (−inf logits).
    """

    def on_train_start(self, ctx: TrainContext) -> None:
        old_out, labels = parent_train_embeddings(ctx, self.name)
        p = self.params
        prototypes, present = structural_prototypes(old_out.embedding, labels, ctx.num_classes,
                                                    p.neighbours, p.temperature, p.steps)
        ctx.state.update({PROTOTYPES: prototypes, PRESENT: present})

    def loss(self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx: TrainContext) -> dict[str, torch.Tensor]:
        require_parent(old, self.name)
        logits = arcface_logits(new.embedding, ctx.state[PROTOTYPES], labels, self.params.scale,
                                self.params.margin, ctx.state[PRESENT])
        return {"base": self.base_loss(new, labels), "arcface": self.params.lam * F.cross_entropy(logits, labels)}
