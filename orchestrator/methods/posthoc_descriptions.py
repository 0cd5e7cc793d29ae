"""The torch-free half of the post-hoc methods (``orchestrator.methods.posthoc``): their parameters
and traits, read by a pipeline file's validation without importing torch.

A post-hoc generation trains no encoder: its encoder is given (``encoder_from`` a generation of the
file, or ``model.pretrained`` a local checkpoint), frozen with its lift and head, and only a map
to its parent's space is fitted on a paired sample (items embedded by both generations).
"""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from orchestrator import limits
from orchestrator.geometry.spaces import Space
from orchestrator.methods.descriptions import MethodDescription, MethodParams


class PostHocParams(MethodParams):
    """Settings every post-hoc map shares.

    space, curv, clip: the given encoder's space and lift (as the method that trained it says them:
                 ``lorentz`` with its curvature K and clip ζ, or a flat space); validation checks
                 them against ``encoder_from``'s method.
    pairs:       size of the paired sample the map is fitted on (every available item when fewer).
    pairs_from:  ``train``: drawn from this generation's training items; ``gallery``: from the
                 served gallery's items (its split of ``data.source``).
    pairs_seed:  the seed of the draw.
    """

    space: Literal["cosine", "euclidean", "lorentz"] = "cosine"
    curv: float = Field(1.0, gt=0)
    clip: float = Field(1.0, gt=0)
    pairs: int = Field(1000, ge=2, le=limits.MAX_ITEMS)
    pairs_from: Literal["train", "gallery"] = "train"
    pairs_seed: int = 0


class LowRankAffineParams(PostHocParams):
    """rank: r, the rank of W = U Vᵀ; ridge: the ridge λ of the least-squares step, relative to the
    mean squared norm of the inputs (keeps the closed form defined on fewer pairs than coordinates)."""

    rank: int = Field(16, ge=1, le=limits.MAX_EMBED_DIM)
    ridge: float = Field(1e-3, ge=0)


class ResidualMLPParams(PostHocParams):
    """hidden_dim: width of the residual MLP; epochs, lr, batch_size, weight_decay: its fit (AdamW,
    constant learning rate, shuffled minibatches, seeded by ``pairs_seed``)."""

    hidden_dim: int = Field(256, ge=1, le=limits.MAX_EMBED_DIM)
    epochs: int = Field(200, ge=1, le=limits.MAX_EPOCHS)
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(128, ge=2, le=limits.MAX_BATCH_SIZE)
    weight_decay: float = Field(1e-4, ge=0)


class SlerpParams(PostHocParams):
    """weight: t of slerp(a, y; t), how far the aligned new query a moves on the unit sphere towards
    the old model's query y (0: a alone, 1: y alone); a tunable parameter (``orchestrator tune``).
    space: cosine only (both generations must embed in cosine space)."""

    weight: float = Field(0.5, ge=0.0, le=1.0)

    @field_validator("space")
    @classmethod
    def _on_the_sphere(cls, space: str) -> str:
        if space != "cosine":
            raise ValueError(f"slerp interpolates on the unit sphere: the given encoder's space must be cosine, got {space!r}")
        return space


class PostHocDescription(MethodDescription):
    """A method that fits a map to the parent and trains no encoder (module docstring)."""

    Params = PostHocParams
    requires_parent = True
    requires_parent_embed_dim = False  # the map bridges the two widths
    trains_encoder: ClassVar[bool] = False

    @property
    def space(self) -> Space:
        return Space(self.params.space)


class ProcrustesDescription(PostHocDescription):
    name = "procrustes"
    summary = "given encoder, frozen; orthogonal Procrustes map to the parent (closed form, SVD) on a paired sample"


class LowRankAffineDescription(PostHocDescription):
    name = "low_rank_affine"
    summary = "given encoder, frozen; rank-r affine map to the parent (reduced-rank least squares) on a paired sample"
    Params = LowRankAffineParams


class ResidualMLPDescription(PostHocDescription):
    name = "residual_mlp"
    summary = "given encoder, frozen; Procrustes map plus a residual MLP to the parent, fitted on a paired sample"
    Params = ResidualMLPParams


class SlerpDescription(PostHocDescription):
    name = "slerp"
    summary = ("given encoder, frozen; queries: Procrustes-aligned new query interpolated on the sphere with the "
               "parent's query (weight t), training-free")
    Params = SlerpParams


# name -> (description, the module whose import registers the method)
POSTHOC: dict[str, tuple[type[MethodDescription], str]] = {
    description.name: (description, "orchestrator.methods.posthoc")
    for description in (ProcrustesDescription, LowRankAffineDescription, ResidualMLPDescription, SlerpDescription)
}
