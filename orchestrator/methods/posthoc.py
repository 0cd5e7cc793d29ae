"""Post-hoc compatibility: a given encoder, frozen, made searchable against its parent's gallery by a
map fitted on a paired sample (Drift-Adapter, Vejendla, EMNLP 2025: "orthogonal Procrustes, low-rank
affine or a small residual MLP recover 95-99 % of full re-embedding recall").

Notation: a paired sample of N items embedded by both generations, taken to the flat charts of
their spaces (``orchestrator.models.adapters.posthoc.to_chart``): x_i ∈ R^n the new (given) encoder's,
y_i ∈ R^m the parent's. Every map g minimises the squared error of the fit

    L(g) = (1/N) Σ_i ‖g(x_i) − y_i‖²₂

- ``procrustes``: g(x) = s Q x with Q Qᵀ = I (m ≤ n) or Qᵀ Q = I (m ≥ n) and a scale s > 0;
  closed form Q = U Vᵀ for the thin SVD Yᵀ X = U Σ Vᵀ (Schönemann 1966) and s = tr Σ / ‖X‖²_F
  (Umeyama 1991, without translation: a rotation about the chart's origin, which between Lorentz
  charts is an isometry of hyperbolic space up to the scale). The scale matters where the two
  charts' radii differ (tangent vectors clipped at different ζ); cosine ranking ignores it.
- ``low_rank_affine``: g(x) = W x + b, rank W ≤ r; closed form by reduced-rank regression
  (Izenman 1975): W₀ = Y_cᵀ X_c (X_cᵀ X_c + λI)⁻¹ on centred data, W = Q_r Q_rᵀ W₀ with Q_r the top r
  right singular vectors of the fitted values X_c W₀ᵀ, b = ȳ − W x̄.
- ``residual_mlp``: g(x) = R x + W₂ relu(W₁ x + b₁) + b₂, R the Procrustes map (fixed), the MLP
  fitted by AdamW from zero output (so it starts at Procrustes).
- ``slerp`` (training-free spherical interpolation, miccunifi/SLERP_backward_compatibility): the
  Procrustes rotation aligns the new query, which is then interpolated on the unit sphere with the
  OLD model's embedding of the same query, weight t (``Slerp``'s docstring gives the equations);
  no parameter is trained, and each query costs one more forward pass of the old model.

The fitted g goes in a ``ChartMap`` (new space → parent's space) as the generation's ``backward``
adapter: the comparison rules' adapter path maps the new queries into the parent's space, so the
evaluation, the gate and serving search the parent's untouched gallery with them. The fit's
history (``posthoc_history``: the loss of the constant map ȳ, the mean-predictor, then the fitted
map's, per epoch where there are epochs) is what the health check judges a generation that trains
no encoder on.
"""
from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import Subset

from orchestrator.geometry.spaces import Space
from orchestrator.methods.base import TrainContext, embed_dataset
from orchestrator.methods.common import SupervisedMethod
from orchestrator.methods.posthoc_descriptions import (
    LowRankAffineDescription,
    PostHocParams,
    ProcrustesDescription,
    ResidualMLPDescription,
    ResidualMLPParams,
    SlerpDescription,
)
from orchestrator.methods.registry import register_method
from orchestrator.models.adapters import BACKWARD_ADAPTER, AffineAdapter, ChartMap, QueryInterpolation
from orchestrator.models.adapters.posthoc import LowRankAffineAdapter, ResidualMLPAdapter, to_chart
from orchestrator.models.outputs import ModelOutput

HISTORY = "posthoc_history"
FIT_SECONDS = "posthoc_fit_seconds"


def fit_error(mapped: torch.Tensor, target: torch.Tensor) -> float:
    """L = (1/N) Σ_i ‖mapped_i − target_i‖²₂ for (N, m) tensors, as a float."""
    return float((mapped - target).pow(2).sum(dim=1).mean())


def mean_map_error(target: torch.Tensor) -> float:
    """L of the constant map g(x) = ȳ: the targets' total variance, what any fitted map must beat."""
    return fit_error(target.mean(dim=0, keepdim=True).expand_as(target), target)


def procrustes_matrix(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """R = s Q (m, n) minimising ‖X Rᵀ − Y‖_F over scales s and matrices Q with orthonormal rows
    (m ≤ n) or columns (m ≥ n): Q = U Vᵀ for the thin SVD Yᵀ X = U Σ Vᵀ, s = tr Σ / ‖X‖²_F.
    source X (N, n), target Y (N, m); float64."""
    x = source.double()
    u, singular, vh = torch.linalg.svd(target.double().T @ x, full_matrices=False)
    return singular.sum() / x.pow(2).sum() * (u @ vh)


def low_rank_affine(source: torch.Tensor, target: torch.Tensor, rank: int,
                    ridge: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U (m, r), V (n, r), b (m,)), float64, of the rank-r affine map g(x) = U Vᵀ x + b minimising
    L on source X (N, n), target Y (N, m) (module docstring; exact when ``ridge`` is 0).
    The ridge λ = ridge · tr(X_cᵀ X_c) / n scales with the inputs."""
    x, y = source.double(), target.double()
    x_mean, y_mean = x.mean(dim=0), y.mean(dim=0)
    xc, yc = x - x_mean, y - y_mean
    gram = xc.T @ xc
    gram = gram + ridge * torch.trace(gram) / gram.shape[0] * torch.eye(gram.shape[0], dtype=gram.dtype)
    full = torch.linalg.solve(gram, xc.T @ yc).T                     # W₀ (m, n)
    _, _, vh = torch.linalg.svd(xc @ full.T, full_matrices=False)    # fitted values X_c W₀ᵀ (N, m)
    left = vh[:rank].T                                               # Q_r (m, r)
    right = full.T @ left                                            # V = W₀ᵀ Q_r (n, r)
    return left, right, y_mean - (left @ right.T) @ x_mean


def fit_residual_mlp(source: torch.Tensor, target: torch.Tensor, params: ResidualMLPParams,
                     generator: torch.Generator) -> tuple[ResidualMLPAdapter, list[float]]:
    """The residual MLP around the Procrustes map R (fixed), fitted by AdamW on L for
    ``params.epochs`` passes of shuffled minibatches; returns it (eval mode, float32) and L after
    each epoch over the whole sample."""
    x, y = source.float(), target.float()
    adapter = ResidualMLPAdapter(x.shape[1], y.shape[1], params.hidden_dim)
    with torch.no_grad():
        adapter.base.copy_(procrustes_matrix(x, y).float())
    optimizer = torch.optim.AdamW([p for p in adapter.parameters() if p.requires_grad], lr=params.lr,
                                  weight_decay=params.weight_decay)
    losses = []
    with torch.enable_grad():
        for _epoch in range(params.epochs):
            for batch in torch.randperm(x.shape[0], generator=generator).split(params.batch_size):
                loss = (adapter(x[batch]) - y[batch]).pow(2).sum(dim=1).mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            with torch.no_grad():
                losses.append(fit_error(adapter(x), y))
    return adapter.eval(), losses


def paired_sample(ctx: TrainContext, params: PostHocParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The paired sample: ``params.pairs`` items of ``ctx.pair_data`` (the training items or the
    gallery's, ``pairs_from``; all when fewer), drawn with ``pairs_seed``, embedded by the parent and
    by the given encoder. Returns (parent's (N, D_old), new (N, D_new)) embeddings."""
    if ctx.old_model is None:
        raise ValueError("a post-hoc map needs the parent generation")
    data = ctx.pair_data if ctx.pair_data is not None else ctx.train_data
    generator = torch.Generator().manual_seed(params.pairs_seed)
    chosen = torch.randperm(len(data), generator=generator)[:params.pairs].sort().values
    sample = Subset(data, chosen.tolist())
    old, _ = embed_dataset(ctx.old_model, sample, ctx.batch_size, ctx.device)
    new, _ = embed_dataset(ctx.new_model, sample, ctx.batch_size, ctx.device)
    return old.embedding, new.embedding


class PostHocMethod(SupervisedMethod):
    """A method that trains no encoder: ``on_train_end`` fits ``fit_map`` on the paired sample, in
    the two spaces' charts, and stores it as the ``backward`` adapter (a ``ChartMap``). Its lift and
    head are built as the supervised methods build theirs, so a given encoder trained by one of them
    (with the same space, curvature and clip) loads into it unchanged; the head is never used."""

    def loss(self, new: ModelOutput, old: ModelOutput | None, labels: torch.Tensor,
             ctx: TrainContext) -> dict[str, torch.Tensor]:
        raise RuntimeError(f"{self.name} trains no encoder: it has no training loss")

    def check_spaces(self, ctx: TrainContext) -> None:
        """ValueError when the map cannot join the given encoder's space to the parent's (every
        chart space can be mapped: nothing to check here)."""

    def fit_map(self, source: torch.Tensor, target: torch.Tensor) -> tuple[nn.Module, list[float]]:
        """The fitted map g (source chart (N, n) → target chart (N, m)) and L after each fit epoch
        (one value for a closed form)."""
        raise NotImplementedError

    def on_train_end(self, ctx: TrainContext) -> None:
        self.check_spaces(ctx)
        old, new = paired_sample(ctx, self.params)
        source = to_chart(new, ctx.new_model.space, ctx.new_model.curv)
        target = to_chart(old, ctx.old_model.space, ctx.old_model.curv)
        started = time.perf_counter()
        fitted, losses = self.fit_map(source, target)
        ctx.state[FIT_SECONDS] = time.perf_counter() - started
        ctx.state[HISTORY] = [{"epoch": float(i), "loss": loss}
                              for i, loss in enumerate([mean_map_error(target.double()), *losses])]
        ctx.new_model.adapters[BACKWARD_ADAPTER] = self.backward_adapter(
            ChartMap(fitted.to(ctx.device), ctx.new_model.space, ctx.new_model.curv, ctx.old_model.space,
                     ctx.old_model.curv))

    def backward_adapter(self, chart_map: ChartMap) -> nn.Module:
        """The ``backward`` adapter stored for the fitted map: the ``ChartMap`` itself."""
        return chart_map


def procrustes_adapter(source: torch.Tensor, target: torch.Tensor) -> tuple[nn.Module, list[float]]:
    """An ``AffineAdapter`` without bias holding s Q = ``procrustes_matrix(source, target)`` (float32)
    and [L] of it on the sample: source (N, n), target (N, m)."""
    matrix = procrustes_matrix(source, target).float()
    adapter = AffineAdapter(source.shape[1], target.shape[1], bias=False)
    with torch.no_grad():
        adapter.linear.weight.copy_(matrix)
    return adapter.eval(), [fit_error(source.double() @ matrix.double().T, target.double())]


@register_method
class Procrustes(ProcrustesDescription, PostHocMethod):
    """g(x) = s Q x, the scaled orthogonal Procrustes solution (module docstring), an ``AffineAdapter``
    without bias holding s Q."""

    def fit_map(self, source: torch.Tensor, target: torch.Tensor) -> tuple[nn.Module, list[float]]:
        return procrustes_adapter(source, target)


@register_method
class Slerp(SlerpDescription, PostHocMethod):
    """Training-free spherical interpolation (miccunifi/SLERP_backward_compatibility). With both
    spaces cosine, x = φ_new(q)/‖φ_new(q)‖ and y = φ_old(q)/‖φ_old(q)‖ the two models' unit
    embeddings of one query q:

        a = R x / ‖R x‖,  R = Q the orthogonal Procrustes rotation fitted on the paired sample
            (``procrustes_matrix``: Q = U Vᵀ for the thin SVD Yᵀ X = U Σ Vᵀ; the scale s drops out
            in the normalisation)
        θ = arccos⟨a, y⟩
        q̂ = slerp(a, y; t) = sin((1 − t) θ) / sin θ · a + sin(t θ) / sin θ · y

    t = ``params.weight`` ∈ [0, 1]: 0 searches with the aligned new query alone (Procrustes), 1 with
    the old model's query alone. The gallery stays the parent's, untouched: only queries move. The
    stored ``backward`` adapter is a ``QueryInterpolation`` around the Procrustes ``ChartMap``; it
    takes the parent's embedding of the query as a second input, which the comparison rules hand
    it (the router embeds an image query with both generations; evaluation passes the parent's
    embeddings of the same items)."""

    def check_spaces(self, ctx: TrainContext) -> None:
        spaces = {"given encoder": self.space, "parent": ctx.old_model.space if ctx.old_model is not None else None}
        wrong = {who: space for who, space in spaces.items() if space not in (None, Space.COSINE)}
        if wrong:
            raise ValueError(f"slerp interpolates on the unit sphere: both generations must embed in cosine space, "
                             f"got {', '.join(f'{who} {space.value}' for who, space in wrong.items())}")

    def fit_map(self, source: torch.Tensor, target: torch.Tensor) -> tuple[nn.Module, list[float]]:
        return procrustes_adapter(source, target)

    def backward_adapter(self, chart_map: ChartMap) -> nn.Module:
        return QueryInterpolation(chart_map, self.params.weight)


@register_method
class LowRankAffine(LowRankAffineDescription, PostHocMethod):
    """g(x) = U Vᵀ x + b of rank ``params.rank`` (at most min(n, m, N): a sample of N pairs fixes
    no more directions), by reduced-rank regression."""

    def fit_map(self, source: torch.Tensor, target: torch.Tensor) -> tuple[nn.Module, list[float]]:
        rank = min(self.params.rank, source.shape[1], target.shape[1], source.shape[0])
        left, right, bias = low_rank_affine(source, target, rank, self.params.ridge)
        adapter = LowRankAffineAdapter(source.shape[1], target.shape[1], rank)
        with torch.no_grad():
            adapter.left.copy_(left)
            adapter.right.copy_(right)
            adapter.bias.copy_(bias)
        return adapter.eval(), [fit_error(source.double() @ (left @ right.T).T + bias, target.double())]


@register_method
class ResidualMLP(ResidualMLPDescription, PostHocMethod):
    """g(x) = R x + MLP(x) (``fit_residual_mlp``), seeded by ``params.pairs_seed``."""

    def fit_map(self, source: torch.Tensor, target: torch.Tensor) -> tuple[nn.Module, list[float]]:
        generator = torch.Generator().manual_seed(self.params.pairs_seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.params.pairs_seed)  # the MLP's initialisation
            return fit_residual_mlp(source.cpu(), target.cpu(), self.params, generator)
