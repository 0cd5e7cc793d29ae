"""Prototype perturbation for backward-compatible learning: the pieces NDPP and ODPP share.

Spec: prototype_perturbation.md (Zhou et al. 2025). Pure tensor functions for

* the perturbed prototype contrastive loss (Eq. 6, and Eq. 2 when nothing is perturbed),
* NDPP's similarity-weighted neighbour repulsion (Eqs. 4 / 7),
* ODPP's hinge objective over sampled prototype pairs (Eqs. 9 / 11) and its inner SGD,

plus ``PerturbedPrototypeMethod``, the base class of ``ndpp`` and ``odpp``: it computes the
prototypes from the training set and applies Eq. 6 with the positive prototypes a subclass stores.

Prototypes (decision, spec §2 / §13.1): class means of L2-normalised embeddings, re-normalised
(``normalized_class_means``), so inner products between prototypes are cosine similarities and
α = 0.01, θ ≈ 0.6 act on unit vectors. Perturbed prototypes p + r are *not* re-normalised.
Classes without training images (``present`` False) have zero prototypes; they are never
neighbours, never in a sampled pair and never negatives.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.geometry.spaces import Space
from orchestrator.methods.base import TrainContext
from orchestrator.methods.common import SupervisedMethod, normalized_class_means, require_parent
from orchestrator.methods.descriptions import PrototypePerturbationDescription
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.outputs import ModelOutput

OLD_PROTOTYPES = "prototypes/old"
PRESENT = "prototypes/present"
POSITIVES = "prototypes/positive"


# --- Eq. 6 ------------------------------------------------------------------------------------
def perturbed_prototype_contrastive_loss(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    old_prototypes: torch.Tensor,
    positive_prototypes: torch.Tensor,
    tau: float,
    present: torch.Tensor | None = None,
) -> torch.Tensor:
    """Perturbed point-to-set contrastive loss (Eq. 6), batch mean.

    embeddings:          (B, D) new-model embeddings e_n.
    labels:              (B,) int64 classes in [0, C).
    old_prototypes:      (C, D) real old prototypes p_o (the negatives).
    positive_prototypes: (C, D) perturbed prototypes p̂ (only row y_i is used, as sample i's positive).
    tau:                 temperature τ.
    present:             optional (C,) bool; classes marked False are dropped from the negatives.

    loss_i = −log( exp(cos(e_i, p̂^{y_i})/τ) / (exp(cos(e_i, p̂^{y_i})/τ) + Σ_{c'≠y_i} exp(cos(e_i, p_o^{c'})/τ)) ).
    With ``positive_prototypes = old_prototypes`` this is the unperturbed prototype loss, Eq. 2.
    Implementation: cosine logits against every old prototype, target column overwritten by the
    cosine to the perturbed positive, then cross-entropy (spec §4).
    """
    if tau <= 0:
        raise ValueError(f"tau must be positive, got {tau}")
    if old_prototypes.shape != positive_prototypes.shape:
        raise ValueError(f"positive_prototypes must have the shape of old_prototypes {tuple(old_prototypes.shape)}, "
                         f"got {tuple(positive_prototypes.shape)}")
    if embeddings.shape[1] != old_prototypes.shape[1]:
        raise ValueError(f"embeddings have dimension {embeddings.shape[1]}, prototypes {old_prototypes.shape[1]}: "
                         "new and old embedding dimensions must match")
    embeddings = F.normalize(embeddings, dim=1)
    logits = embeddings @ F.normalize(old_prototypes, dim=1).T / tau
    if present is not None:
        logits = logits.masked_fill(~present.to(logits.device).unsqueeze(0), float("-inf"))
    positive = (embeddings * F.normalize(positive_prototypes[labels], dim=1)).sum(dim=1) / tau
    logits = logits.scatter(1, labels.unsqueeze(1), positive.unsqueeze(1))
    return F.cross_entropy(logits, labels)


# --- NDPP, Eqs. 4 / 7 -------------------------------------------------------------------------
def neighbour_repulsion(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    k: int,
    exclude_self: bool,
    candidate_mask: torch.Tensor | None = None,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Similarity-weighted repulsion of each anchor from its k most cosine-similar candidates.

    anchors:        (C, D) the prototypes being perturbed (p_o for Eq. 4, p̂_o for Eq. 7).
    candidates:     (C', D) the prototypes they are repelled from (p_o, resp. p_n).
    k:              neighbours per anchor; clamped to the number of eligible candidates.
    exclude_self:   drop candidate c for anchor c (needs C' = C): "other classes" in Eq. 4, and
                    Decision (spec §13.2) for Eq. 7: the own class's new prototype is excluded,
                    since including it would push the target away from its own new centre.
    candidate_mask: optional (C',) bool; False rows (classes without images) are never neighbours.
    chunk_size:     anchors per block of the (chunk, C') similarity matrix (memory bound).

    Returns r (C, D): r^c = Σ_{c'∈K^c} s^{c'} (a^c − b^{c'}) / Σ_{c'∈K^c} s^{c'}, s = cos(a^c, b^{c'}).
    It points AWAY from the neighbours (a^c minus their weighted centroid), the intended repulsion
    (the paper's prose says the opposite; the formula is what is implemented, spec §5.1).
    Decision (spec §13.4): weights are clamped to ≥ 0, so dissimilar neighbours do not pull; when
    all k weights vanish (or there is no eligible candidate, or the anchor is zero) r^c = 0.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if anchors.shape[1] != candidates.shape[1]:
        raise ValueError(f"anchors have dimension {anchors.shape[1]}, candidates {candidates.shape[1]}")
    if exclude_self and anchors.shape[0] != candidates.shape[0]:
        raise ValueError(f"exclude_self needs as many candidates as anchors, got {candidates.shape[0]} "
                         f"candidates for {anchors.shape[0]} anchors")
    num_candidates = candidates.shape[0]
    eligible = torch.ones(num_candidates, dtype=torch.bool, device=candidates.device)
    if candidate_mask is not None:
        eligible = candidate_mask.to(candidates.device).bool()
    k = min(k, num_candidates)
    unit_candidates = F.normalize(candidates, dim=1)
    repulsion = torch.zeros_like(anchors)
    for start in range(0, anchors.shape[0], chunk_size):
        block = anchors[start:start + chunk_size]
        similarity = F.normalize(block, dim=1) @ unit_candidates.T  # (b, C')
        allowed = eligible.unsqueeze(0).expand_as(similarity).clone()
        if exclude_self:
            rows = torch.arange(block.shape[0], device=block.device)
            allowed[rows, rows + start] = False
        similarity = similarity.masked_fill(~allowed, float("-inf"))
        top_similarity, top_index = similarity.topk(k, dim=1)
        weights = top_similarity.clamp(min=0.0)  # -inf (ineligible) and negative similarities -> 0
        total = weights.sum(dim=1, keepdim=True)
        centroid = torch.einsum("bk,bkd->bd", weights, candidates[top_index]) / total.clamp(min=1e-12)
        repulsion[start:start + chunk_size] = torch.where(total > 0, block - centroid, torch.zeros_like(block))
    return repulsion


# --- ODPP, Eqs. 9 / 11 ------------------------------------------------------------------------
def sample_class_pairs(present: torch.Tensor, num_pairs: int, generator: torch.Generator) -> torch.Tensor:
    """``num_pairs`` ordered pairs (c, c') of distinct present classes, uniform, as (P, 2) int64 (CPU).

    present: (C,) bool. Decision (spec §13.8): uniform over ordered pairs of distinct present
    classes; the same pairs serve both terms of Eq. 11 (c'' = c').
    """
    classes = torch.nonzero(present.cpu()).flatten()
    n = classes.numel()
    if n < 2:
        raise ValueError(f"ODPP needs at least 2 classes with training images, got {n}")
    first = torch.randint(0, n, (num_pairs,), generator=generator)
    second = (first + torch.randint(1, n, (num_pairs,), generator=generator)) % n
    return torch.stack([classes[first], classes[second]], dim=1)


def odpp_perturbation_objective(
    old_prototypes: torch.Tensor,
    perturbations: torch.Tensor,
    pairs: torch.Tensor,
    theta_old: float,
    new_prototypes: torch.Tensor | None = None,
    theta_new: float = 0.6,
    gamma: float = 1.0,
) -> torch.Tensor:
    """ODPP hinge objective over a batch of class pairs: Eq. 9, or Eq. 11 with ``new_prototypes``.

    old_prototypes: (C, D) p_o.      perturbations: (C, D) r (gradients flow into it).
    pairs:          (P, 2) int64 ordered class pairs (c, c'), c ≠ c'.
    new_prototypes: (C, D) p_n (constants), or None for Eq. 9 alone.

    Σ_pairs max(0, (p_o^c + r^c)·(p_o^{c'} + r^{c'}) − θ_old) + γ Σ_pairs max(0, (p_o^c + r^c)·p_n^{c'} − θ_new).
    Plain inner products, no re-normalisation of p + r (spec §13.9; the hinge can therefore also
    shrink p + r). Decision: reduction is the SUM over the pair batch, as printed; each active pair
    moves r^c by lr·|p| per step, whereas a mean would make the step 1/P as large (1/1024 at the
    paper's batch), i.e. no visible perturbation at lr 1e-3.
    """
    pairs = pairs.to(old_prototypes.device)
    first, second = pairs[:, 0], pairs[:, 1]
    perturbed = old_prototypes + perturbations
    anchor = perturbed[first]
    objective = F.relu((anchor * perturbed[second]).sum(dim=1) - theta_old).sum()
    if new_prototypes is not None:
        objective = objective + gamma * F.relu((anchor * new_prototypes[second]).sum(dim=1) - theta_new).sum()
    return objective


def optimise_odpp_perturbations(
    old_prototypes: torch.Tensor,
    perturbations: torch.Tensor,
    present: torch.Tensor,
    generator: torch.Generator,
    theta_old: float,
    new_prototypes: torch.Tensor | None = None,
    theta_new: float = 0.6,
    gamma: float = 1.0,
    inner_epochs: int = 50,
    lr: float = 1e-3,
    batch_size: int = 1024,
    pairs_per_epoch: int = 1024,
) -> torch.Tensor:
    """Minimise Eq. 9 (or Eq. 11) over r with mini-batch SGD; prototypes stay fixed (spec §6.3).

    old_prototypes: (C, D) p_o.   perturbations: (C, D) the starting r (zeros before training;
    the previous r afterwards — Decision: warm start across outer epochs, spec §13.9).
    present: (C,) bool; absent classes are never sampled, so their r never changes.
    generator: CPU generator that draws the pairs (determinism).
    Each inner epoch draws ``pairs_per_epoch`` fresh pairs (the paper: N_img, the number of
    training images) and steps over them in batches of ``batch_size``.
    Decision: plain SGD, no momentum, no weight decay (none is given). Returns r (C, D), detached.
    """
    if inner_epochs < 0 or lr <= 0 or batch_size < 1 or pairs_per_epoch < 1:
        raise ValueError(f"invalid inner optimisation settings: inner_epochs={inner_epochs}, lr={lr}, "
                         f"batch_size={batch_size}, pairs_per_epoch={pairs_per_epoch}")
    if perturbations.shape != old_prototypes.shape:
        raise ValueError(f"perturbations must have shape {tuple(old_prototypes.shape)}, got {tuple(perturbations.shape)}")
    old_prototypes = old_prototypes.detach()
    new_prototypes = new_prototypes.detach() if new_prototypes is not None else None
    r = perturbations.detach().clone().requires_grad_(True)
    optimiser = torch.optim.SGD([r], lr=lr)
    with torch.enable_grad():
        for _ in range(inner_epochs):
            pairs = sample_class_pairs(present, pairs_per_epoch, generator).to(old_prototypes.device)
            for start in range(0, pairs_per_epoch, batch_size):
                objective = odpp_perturbation_objective(
                    old_prototypes, r, pairs[start:start + batch_size], theta_old, new_prototypes, theta_new, gamma
                )
                optimiser.zero_grad(set_to_none=True)
                objective.backward()
                optimiser.step()
    return r.detach()


# --- the shared method skeleton ---------------------------------------------------------------


def class_prototypes(model: CompatibleModel, ctx: TrainContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Prototypes of ``model`` over the whole training set (spec §2, ``GetPrototypes(φ, D)``).

    Returns ``(prototypes (num_classes, D) unit rows, 0 for absent classes; present (num_classes,) bool)``.
    Decision (spec §13.7): a full eval-mode pass over the non-augmented training set.
    """
    if model.space not in (Space.COSINE, Space.EUCLIDEAN):
        raise ValueError(f"prototype perturbation needs a flat-space model, got space {model.space.value!r}")
    output, labels = ctx.embed_train_data(model)
    return normalized_class_means(output.embedding, labels, ctx.num_classes)


class PerturbedPrototypeMethod(PrototypePerturbationDescription, SupervisedMethod):
    """L = CE + λ·Eq. 6, positives from ``ctx.state[POSITIVES]`` (set by the subclass's hooks).

    ``on_train_start`` stores the old prototypes p_o of every class of the training set, taken
    with the frozen parent (spec §2), and the present mask; subclasses then build the positives.
    """

    def on_train_start(self, ctx: TrainContext) -> None:
        if ctx.old_model is None:
            raise ValueError(f"method {self.name!r} needs a parent generation")
        old_prototypes, present = class_prototypes(ctx.old_model, ctx)
        ctx.state[OLD_PROTOTYPES] = old_prototypes
        ctx.state[PRESENT] = present

    def new_prototypes(self, ctx: TrainContext) -> torch.Tensor:
        """p_n (num_classes, D) of the model being trained, checked against p_o's dimension."""
        prototypes, _ = class_prototypes(ctx.new_model, ctx)
        old_dim = ctx.state[OLD_PROTOTYPES].shape[1]
        if prototypes.shape[1] != old_dim:
            raise ValueError(f"method {self.name!r}: new embedding dimension {prototypes.shape[1]} "
                             f"differs from the old one {old_dim} (D_n must equal D_o)")
        return prototypes

    def loss(self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx: TrainContext) -> dict[str, torch.Tensor]:
        require_parent(old, self.name)
        compatibility = perturbed_prototype_contrastive_loss(
            new.embedding, labels, ctx.state[OLD_PROTOTYPES], ctx.state[POSITIVES], self.params.tau,
            present=ctx.state[PRESENT],
        )
        return {"base": self.base_loss(new, labels), "compatibility": self.params.lam * compatibility}
