"""``fct``: Forward Compatible Training (Ramanujan et al. 2022; lambda_orthogonality.md §2.5, §5).

The new encoder is trained independently (plain CE through its own linear head, like
``independent``); after training, a forward transformation F: R^d → R^n is fitted on the frozen
models' embeddings of the training set, mapping OLD features directly into the NEW space::

    L_F = (1/N) Σ_i ‖F(h_i^k) − h_i^t‖²₂        h^k = φ_old(x_i) ∈ R^d,  h^t = φ_new(x_i) ∈ R^n

(λ-orthogonality's F instead targets the backward-aligned B(h^t), eq. 7; FCT has no backward map.)

Retrieval: the old gallery is upgraded without new-model inference to F(h^k) and searched with the
new model's raw queries h^t in the new space (table row F(φ_old)/φ_new, the "forward" path of
``orchestrator.comparison``). New queries against the UNTOUCHED old gallery (φ_new/φ_old) have no
meaning — the two models were trained independently — and are refused, not computed. Backfilled
items are stored as h^t; FCT has no ordering of its own and is evaluated with a random backfilling
order (§2.11; ``backfill.order: random``).

F is stored as ``model.adapters["forward_map"]`` (``orchestrator.models.adapters.FORWARD_ADAPTER``,
the slot λ-orthogonality uses), ALONE: a generation with a forward map and no ``backward`` adapter is how the comparison
rules recognise "trained independently of its parent, reachable from it through F only".
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.methods.base import TrainContext
from orchestrator.methods.common import SupervisedMethod, paired_train_embeddings
from orchestrator.methods.descriptions import FCTDescription, FCTParams
from orchestrator.methods.registry import register_method
from orchestrator.models.adapters import FORWARD_ADAPTER, AffineAdapter, EmbeddingMap, MLPAdapter
from orchestrator.models.outputs import ModelOutput


def build_forward_map(old_dim: int, new_dim: int, form: str, hidden_dim: int, normalize_inputs: bool) -> EmbeddingMap:
    """A fresh F: R^old_dim → R^new_dim wrapped in an ``EmbeddingMap`` (input L2-normalised when
    ``normalize_inputs``): ``MLPAdapter(old_dim, new_dim, hidden_dim)`` for ``form="mlp"``,
    ``AffineAdapter(old_dim, new_dim)`` (identity / prefix init, with bias) for ``form="affine"``.
    Also the module structure a checkpoint of an ``fct`` generation is rebuilt with (the saved
    ``normalize_input`` buffer then overrides the flag)."""
    if form == "mlp":
        inner = MLPAdapter(old_dim, new_dim, hidden_dim)
    elif form == "affine":
        inner = AffineAdapter(old_dim, new_dim)
    else:
        raise ValueError(f"form must be 'mlp' or 'affine', got {form!r}")
    return EmbeddingMap(inner, normalize_inputs)


def forward_loss(forward: torch.nn.Module, old_emb: torch.Tensor, new_emb: torch.Tensor, normalize_targets: bool) -> torch.Tensor:
    """L_F = mean_i ‖F(h_i^k) − h_i^t‖²₂ on one batch: old_emb h^k (B, d), new_emb h^t (B, n).

    The squared L2 norm sums over coordinates (as λ-orthogonality's ``_squared_error``, §10 item
    10); h^t is L2-normalised first when ``normalize_targets``. ``forward`` normalises its input
    itself (``EmbeddingMap``).
    """
    target = F.normalize(new_emb, dim=1) if normalize_targets else new_emb
    return (forward(old_emb) - target).pow(2).sum(dim=1).mean()


def fit_forward_map(
    old_emb: torch.Tensor,
    new_emb: torch.Tensor,
    params: FCTParams,
    generator: torch.Generator | None = None,
) -> tuple[EmbeddingMap, list[dict[str, float]]]:
    """Fit F by minimising L_F (``forward_loss``) on stored embeddings.

    old_emb: (N, d) the parent's embeddings h^k, as its gallery stores them (raw);
    new_emb: (N, n) this generation's embeddings h^t of the same items, row for row.
    generator: CPU generator for the minibatch order (None: the global RNG; F's init uses the
    global RNG). Adam (lr ``adapter_lr``) for ``adapter_epochs`` passes in shuffled minibatches of
    ``adapter_batch_size`` (the last, smaller one included); the inputs are detached (both models
    stay frozen). Returns ``(F in eval mode on the inputs' device and dtype, history)``, history
    one dict per epoch: ``epoch`` and ``loss`` (sample-weighted mean L_F over the epoch).
    """
    if old_emb.dim() != 2 or new_emb.dim() != 2 or old_emb.shape[0] != new_emb.shape[0]:
        raise ValueError(
            f"old_emb and new_emb must be (N, d) and (N, n) with the same N, got {tuple(old_emb.shape)} "
            f"and {tuple(new_emb.shape)}"
        )
    if old_emb.shape[0] == 0:
        raise ValueError("fit_forward_map: no embeddings to fit on (N = 0)")
    old_emb, new_emb = old_emb.detach(), new_emb.detach().to(old_emb)
    normalize = params.inputs_normalized()
    forward = build_forward_map(old_emb.shape[1], new_emb.shape[1], params.form, params.hidden_dim, normalize)
    forward.to(device=old_emb.device, dtype=old_emb.dtype)
    optimizer = torch.optim.Adam(forward.parameters(), lr=params.adapter_lr)
    num_items = old_emb.shape[0]
    history: list[dict[str, float]] = []
    forward.train()
    with torch.enable_grad():
        for epoch in range(params.adapter_epochs):
            order = torch.randperm(num_items, generator=generator).to(old_emb.device)
            total = 0.0
            for batch in order.split(params.adapter_batch_size):
                loss = forward_loss(forward, old_emb[batch], new_emb[batch], normalize)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += loss.item() * batch.numel()
            history.append({"epoch": float(epoch), "loss": total / num_items})
    return forward.eval(), history


@register_method
class FCT(FCTDescription, SupervisedMethod):
    """FCT: an independently trained new model (CE through its own linear head) plus a forward
    transformation F fitted in ``on_train_end`` (module docstring).

    F maps the parent's RAW embeddings — what the parent's gallery shards store — into this
    generation's raw space; a chain of ``fct`` updates is searched through F_t∘…∘F_{k+1}
    (``orchestrator.comparison``, forward path). F is fitted on the training set without
    augmentation (``ctx.train_data``); the fit's history is kept in ``ctx.state["fct_history"]``.
    """

    def loss(
        self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor, ctx: TrainContext
    ) -> dict[str, torch.Tensor]:
        return {"base": self.base_loss(new, labels)}

    def on_train_end(self, ctx: TrainContext) -> None:
        old_out, new_out, _labels = paired_train_embeddings(ctx, self.name)
        forward, history = fit_forward_map(old_out.embedding, new_out.embedding, self.params)
        ctx.new_model.adapters[FORWARD_ADAPTER] = forward
        ctx.state["fct_history"] = history
