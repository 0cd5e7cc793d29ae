"""``lambda_orth``: λ-orthogonality compatibility adapters (Ricci et al.; lambda_orthogonality.md).

The new encoder is trained independently (plain CE through its own linear head, §0); after
training, two small maps are fitted on the frozen models' embeddings of the training set:

- the backward map B: R^n → R^n (new → old space), either strictly orthogonal B_⊥ = expm(U − Uᵀ)
  (§2.3) or affine B_λ(x) = W x + b regularised by L_λ = σ(α(D − λ))·D, D = ‖WWᵀ − I‖_F (§2.4);
- the forward map F: R^d → R^n (old → backward-aligned space), affine (§2.5);

jointly, with L = w1·L_F + w2·L_B + w3·L_C (+ L_λ for B_λ) (eq. 10, §2.9). They are stored as
``model.adapters["backward"]`` and ``model.adapters["forward_map"]`` (the slots
``BACKWARD_ADAPTER``, ``FORWARD_ADAPTER`` of ``orchestrator.models.adapters``), each an
``EmbeddingMap`` around the fitted adapter, which checkpoints describe through the adapter registry.

Retrieval (§2.10): a query of this generation is ``B(h_t)``; against the parent's UNTOUCHED
gallery h_k it is compared on the common prefix, ``truncate_to_common(backward_transform(new, q),
gallery)`` (table row B(φ_new)/φ_old). A gallery upgraded without new-model inference is
``forward_transform(new, h_k)`` (row F(φ_old)); backfilled items are stored as ``B(h_t)``, in the
order ``backfill_order`` gives (§2.11).
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.methods.base import TrainContext
from orchestrator.methods.common import SupervisedMethod, class_mean_distances, paired_train_embeddings
from orchestrator.methods.descriptions import LambdaOrthogonalityDescription, LambdaOrthParams
from orchestrator.methods.registry import register_method
from orchestrator.models.adapters import (
    BACKWARD_ADAPTER,
    FORWARD_ADAPTER,
    AffineAdapter,
    EmbeddingMap,
    OrthogonalAdapter,
    gram_deviation,
    lambda_orthogonality_penalty,
    truncate_to_common,
)
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.outputs import ModelOutput


def build_adapters(old_dim: int, new_dim: int, variant: str, normalize_inputs: bool) -> tuple[EmbeddingMap, EmbeddingMap]:
    """Fresh ``(backward, forward)`` maps: B (new_dim → new_dim) and F (old_dim → new_dim).

    B is ``OrthogonalAdapter(n)`` (identity at init) for ``variant="orthogonal"``, else
    ``AffineAdapter(n, n)`` (identity init); F is ``AffineAdapter(d, n)`` with bias (a single
    affine layer: "only two matrices", App. H), identity / prefix-embedding init. Also the module
    structure to rebuild before loading a checkpoint of a ``lambda_orth`` generation (the saved
    ``normalize_input`` buffer then overrides the flag given here).
    """
    if variant == "orthogonal":
        backward = OrthogonalAdapter(new_dim)
    elif variant == "lambda":
        backward = AffineAdapter(new_dim, new_dim)
    else:
        raise ValueError(f"variant must be 'orthogonal' or 'lambda', got {variant!r}")
    return EmbeddingMap(backward, normalize_inputs), EmbeddingMap(AffineAdapter(old_dim, new_dim), normalize_inputs)


def backward_matrix(backward: nn.Module) -> torch.Tensor:
    """The (n, n) matrix of a backward map (``EmbeddingMap`` or bare adapter): expm(P) for B_⊥, W for B_λ."""
    inner = backward.map if isinstance(backward, EmbeddingMap) else backward
    return inner.matrix if isinstance(inner, OrthogonalAdapter) else inner.weight


def procrustes_rotation(old_emb: torch.Tensor, new_emb: torch.Tensor) -> torch.Tensor:
    """The rotation Q ∈ SO(n) minimising Σ_i ‖(Q h_t,i)[:m] − h_k,i[:m]‖² (approximately when n > d).

    old_emb h_k (N, d), new_emb h_t (N, n) → Q (n, n), float64. Kabsch: with the cross-covariance
    M = H_tᵀ Ĥ_k = U S Vᵀ (Ĥ_k = h_k truncated to n coordinates, or zero-padded to n when d < n),
    Q = V diag(1, …, 1, sign det(V Uᵀ)) Uᵀ. Zero-padding makes the n > d case the exact minimiser
    of a slightly different problem (it also pulls the extra coordinates towards 0); it is only an
    initialisation.
    """
    n = new_emb.shape[1]
    target = old_emb.double()
    target = target[:, :n] if target.shape[1] >= n else F.pad(target, (0, n - target.shape[1]))
    u, _, vh = torch.linalg.svd(new_emb.double().T @ target)
    signs = torch.ones(n, dtype=torch.float64, device=u.device)
    signs[-1] = torch.sign(torch.det(vh.T @ u.T))
    return vh.T @ torch.diag(signs) @ u.T


def rotation_log(rotation: torch.Tensor) -> torch.Tensor:
    """A real skew-symmetric P with expm(P) = Q, for Q (n, n) in SO(n) (no eigenvalue exactly −1).

    With S = (Q + Qᵀ)/2 (eigenvalues cos θ_k) and K = (Q − Qᵀ)/2 (= Σ sin θ_k J_k on the rotation
    planes), log Q = g(S)·K with g(c) = arccos(c)/√(1 − c²), g = 1 where sin θ ≈ 0. Computed in
    float64 with ``eigh``, so it needs no SciPy.
    """
    q = rotation.double()
    cosines, vectors = torch.linalg.eigh((q + q.T) / 2)
    theta = torch.arccos(cosines.clamp(-1.0, 1.0))
    sines = torch.sin(theta)
    gain = torch.where(sines > 1e-7, theta / sines.clamp_min(1e-7), torch.ones_like(theta))
    log = (vectors * gain) @ vectors.T @ ((q - q.T) / 2)
    return (log - log.T) / 2


def init_orthogonal_from_procrustes(adapter: OrthogonalAdapter, old_emb: torch.Tensor, new_emb: torch.Tensor) -> None:
    """Set B_⊥ = expm(U − Uᵀ) to ``procrustes_rotation(old_emb, new_emb)`` (U = strict upper part of its log)."""
    log = rotation_log(procrustes_rotation(old_emb, new_emb))
    with torch.no_grad():
        adapter.upper.copy_(log[adapter.upper_rows, adapter.upper_cols].to(adapter.upper))


def multi_positive_contrastive(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    anchor_labels: torch.Tensor,
    candidate_labels: torch.Tensor,
    tau: float,
) -> torch.Tensor:
    """StableRep multi-positive contrastive loss (lambda_orthogonality.md eq. 8), mean over anchors.

    anchors (A, D), candidates (C, D), anchor_labels (A,), candidate_labels (C,). For anchor a::

        ã = a/‖a‖, c̃_i = c_i/‖c_i‖
        q_i = exp(ã·c̃_i / τ) / Σ_j exp(ã·c̃_j / τ)
        p_i = 1[y(c_i) = y(a)] / Σ_j 1[y(c_j) = y(a)]
        L(a) = − Σ_i p_i log q_i

    Decision (§10 item 4, option (a)): the candidate set is the other set, cross-set — every
    candidate row, the anchor's own paired row included (it is a positive), no anchor-vs-anchor
    terms and no symmetrisation; gradients flow into both arguments. Anchors with no same-label
    candidate have no target distribution and are left out of the mean (0 if none has one).
    """
    if anchors.dim() != 2 or candidates.dim() != 2 or anchors.shape[1] != candidates.shape[1]:
        raise ValueError(
            "anchors and candidates must be (A, D) and (C, D) with the same D, got "
            f"{tuple(anchors.shape)} and {tuple(candidates.shape)}"
        )
    if anchor_labels.shape != (anchors.shape[0],) or candidate_labels.shape != (candidates.shape[0],):
        raise ValueError(
            f"anchor_labels must be ({anchors.shape[0]},) and candidate_labels ({candidates.shape[0]},), got "
            f"{tuple(anchor_labels.shape)} and {tuple(candidate_labels.shape)}"
        )
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau!r}")
    log_q = torch.log_softmax(F.normalize(anchors, dim=1) @ F.normalize(candidates, dim=1).T / tau, dim=1)
    positive = (anchor_labels.unsqueeze(1) == candidate_labels.unsqueeze(0)).to(log_q.dtype)
    counts = positive.sum(dim=1)
    has_positive = counts > 0
    per_anchor = -(positive * log_q).sum(dim=1) / counts.clamp(min=1)
    if not has_positive.any():
        return per_anchor.sum() * 0.0
    return per_anchor[has_positive].mean()


def _squared_error(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """‖a − b‖²₂ per row, mean over rows. Decision (§10 item 10): the paper's squared L2 norm (sum
    over coordinates), not ``MSELoss``'s mean over elements, which would shrink L_F and L_B by the
    dimension relative to L_C."""
    return (a - b).pow(2).sum(dim=1).mean()


def adapter_losses(
    backward: nn.Module,
    forward: nn.Module,
    old_emb: torch.Tensor,
    new_emb: torch.Tensor,
    labels: torch.Tensor,
    params: LambdaOrthParams,
) -> dict[str, torch.Tensor]:
    """The weighted terms of eq. 10 on one batch (§2.9): old_emb h_k (B, d), new_emb h_t (B, n), labels (B,).

    forward     w1·‖F(h_k) − B(h_t)‖²                                    (eq. 7)
    backward    w2·‖B(h_t)[:m] − h_k[:m]‖²                               (eq. 2, m = min(d, n))
    contrastive w3·[contr(F(h_k), B(h_t)) + contr(F(h_k)[:m], h_k[:m])]  (eq. 9)
    lambda      σ(α(D − λ))·D, D = ‖WWᵀ − I‖_F                           (eq. 6; B_λ only)

    ``backward`` / ``forward`` must apply any input normalisation themselves (``EmbeddingMap``);
    the old targets h_k are normalised here when ``params.inputs_normalized()``.
    """
    z_t = backward(new_emb)
    z_f = forward(old_emb)
    target = F.normalize(old_emb, dim=1) if params.inputs_normalized() else old_emb
    z_t_common, target_b = truncate_to_common(z_t, target)
    z_f_common, target_c = truncate_to_common(z_f, target)
    tau = params.contrastive_tau
    contrastive = multi_positive_contrastive(z_f, z_t, labels, labels, tau) + multi_positive_contrastive(
        z_f_common, target_c, labels, labels, tau
    )
    terms = {
        "forward": params.w_forward * _squared_error(z_f, z_t),
        "backward": params.w_backward * _squared_error(z_t_common, target_b),
        "contrastive": params.w_contrastive * contrastive,
    }
    if params.variant == "lambda":
        terms["lambda"] = lambda_orthogonality_penalty(backward_matrix(backward), params.lam, params.alpha)
    return terms


def fit_compatibility_adapters(
    old_emb: torch.Tensor,
    new_emb: torch.Tensor,
    labels: torch.Tensor,
    params: LambdaOrthParams,
    generator: torch.Generator | None = None,
) -> tuple[EmbeddingMap, EmbeddingMap, list[dict[str, float]]]:
    """Train B and F jointly on stored embeddings (lambda_orthogonality.md §2.9).

    old_emb: (N, d) the parent's embeddings h_k (its published space, see ``backward_transform``);
    new_emb: (N, n) this generation's embeddings h_t of the same items; labels: (N,) class ids.
    generator: CPU generator for the minibatch order (None: the global RNG).
    B_⊥ starts at the Procrustes rotation when ``params.procrustes_init``. Adam (lr ``adapter_lr``) for
    ``adapter_epochs`` passes in shuffled minibatches of
    ``adapter_batch_size`` (the last, smaller one included). Both models stay frozen: the inputs
    are detached. Returns ``(backward, forward, history)`` on the inputs' device, in eval mode;
    history has one dict per epoch: sample-weighted means ``loss`` and ``loss/<term>``, and
    ``gram_deviation`` = ‖BBᵀ − I‖_F at the end of the epoch.
    """
    if old_emb.dim() != 2 or new_emb.dim() != 2 or old_emb.shape[0] != new_emb.shape[0]:
        raise ValueError(
            f"old_emb and new_emb must be (N, d) and (N, n) with the same N, got {tuple(old_emb.shape)} "
            f"and {tuple(new_emb.shape)}"
        )
    if labels.shape != (old_emb.shape[0],):
        raise ValueError(f"labels must have shape ({old_emb.shape[0]},), got {tuple(labels.shape)}")
    if old_emb.shape[0] == 0:
        raise ValueError("fit_compatibility_adapters: no embeddings to fit on (N = 0)")
    old_emb, new_emb = old_emb.detach(), new_emb.detach().to(old_emb.dtype)
    labels = labels.to(old_emb.device)
    backward, forward = build_adapters(old_emb.shape[1], new_emb.shape[1], params.variant, params.inputs_normalized())
    backward.to(device=old_emb.device, dtype=old_emb.dtype)
    if params.variant == "orthogonal" and params.procrustes_init:
        normalize = params.inputs_normalized()
        init_orthogonal_from_procrustes(
            backward.map,
            F.normalize(old_emb, dim=1) if normalize else old_emb,
            F.normalize(new_emb, dim=1) if normalize else new_emb,
        )
    forward.to(device=old_emb.device, dtype=old_emb.dtype)
    optimizer = torch.optim.Adam([*backward.parameters(), *forward.parameters()], lr=params.adapter_lr)
    num_items = old_emb.shape[0]
    history: list[dict[str, float]] = []
    with torch.enable_grad():
        for epoch in range(params.adapter_epochs):
            order = torch.randperm(num_items, generator=generator).to(old_emb.device)
            sums: dict[str, float] = {}
            for batch in order.split(params.adapter_batch_size):
                terms = adapter_losses(backward, forward, old_emb[batch], new_emb[batch], labels[batch], params)
                total = torch.stack(list(terms.values())).sum()
                optimizer.zero_grad(set_to_none=True)
                total.backward()
                optimizer.step()
                size = batch.numel()
                sums["loss"] = sums.get("loss", 0.0) + total.item() * size
                for name, value in terms.items():
                    sums[f"loss/{name}"] = sums.get(f"loss/{name}", 0.0) + value.item() * size
            stats = {name: value / num_items for name, value in sums.items()}
            with torch.no_grad():
                stats["gram_deviation"] = float(gram_deviation(backward_matrix(backward)))
            stats["epoch"] = float(epoch)
            history.append(stats)
    return backward.eval(), forward.eval(), history


@torch.no_grad()
def backward_transform(model: CompatibleModel, embeddings: torch.Tensor) -> torch.Tensor:
    """A generation's published embedding: ``B(h)`` (N, n) when it has a ``backward`` adapter, else h.

    This is how a query of a ``lambda_orth`` generation meets a parent's gallery: compare
    ``truncate_to_common(backward_transform(new, queries), parent_gallery)`` — B(h_t) and the
    parent's untouched gallery on their common prefix m = min(d, n) (row B(φ_new)/φ_old, §2.8,
    §2.10) — with the generation's distance. Backfilled gallery items of this generation are
    stored as ``B(h_t)`` too (§2.11), so a later ``lambda_orth`` generation aligns to this space.
    """
    if BACKWARD_ADAPTER not in model.adapters:
        return embeddings
    return model.adapters[BACKWARD_ADAPTER](embeddings)


@torch.no_grad()
def forward_transform(model: CompatibleModel, old_embeddings: torch.Tensor) -> torch.Tensor:
    """F(h_k) (N, n): the parent's gallery (N, d) upgraded into this generation's aligned space
    without new-model inference (rows F(φ_old)/·, §2.10). ValueError if the model has no forward map."""
    if FORWARD_ADAPTER not in model.adapters:
        raise ValueError(
            f"forward_transform: the model has no {FORWARD_ADAPTER!r} adapter (not a fitted lambda_orth generation)"
        )
    return model.adapters[FORWARD_ADAPTER](old_embeddings)


def backfill_order(
    forward_old_embeddings: torch.Tensor, labels: torch.Tensor, distance: Literal["l2", "cosine"] = "l2"
) -> torch.Tensor:
    """Partial-backfilling order (§2.11): gallery indices (N,) by DESCENDING distance to the class mean.

    forward_old_embeddings: (N, n) the forward-adapted gallery F(h_k); labels: (N,) class ids.
    The distances are ``class_mean_distances``; the items least representative of their class
    are backfilled first; ties keep gallery order (stable sort).
    """
    gap = class_mean_distances(forward_old_embeddings, labels, distance)
    return torch.sort(gap, descending=True, stable=True).indices


@register_method
class LambdaOrthogonality(LambdaOrthogonalityDescription, SupervisedMethod):
    """λ-orthogonality: an independently trained new model (CE through its own linear head, §0)
    made compatible afterwards by the B / F adapters fitted in ``on_train_end``.

    Decision (multi-step, not in the paper, §7): the "old space" B aligns to is the parent's
    published space, ``backward_transform(parent, h)`` — B_{t−1}(h^{t−1}) when the parent is itself
    a ``lambda_orth`` generation, its raw embedding otherwise — so a chain of updates keeps one
    unified space (the paper's §7 extrapolation) and B(h_t) meets a parent gallery stored in it.
    The adapters train on the training set without augmentation (``ctx.train_data``); the fit's
    history is kept in ``ctx.state["lambda_orth_history"]``.
    """

    def loss(
        self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx: TrainContext
    ) -> dict[str, torch.Tensor]:
        return {"base": self.base_loss(new, labels)}

    def on_train_end(self, ctx: TrainContext) -> None:
        old_out, new_out, new_labels = paired_train_embeddings(ctx, self.name)
        old_emb = backward_transform(ctx.old_model, old_out.embedding)
        backward, forward, history = fit_compatibility_adapters(old_emb, new_out.embedding, new_labels, self.params)
        ctx.new_model.adapters[BACKWARD_ADAPTER] = backward
        ctx.new_model.adapters[FORWARD_ADAPTER] = forward
        ctx.state["lambda_orth_history"] = history
