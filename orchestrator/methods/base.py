"""The one protocol every compatibility method implements.

A method decides four things about a model generation:

* the space its embeddings live in and the distance that searches it (``space``, ``curv``),
* the space lift and the classification head it trains with (``build_lift``, ``build_head``),
* its training objective, as a dict of named, already-weighted loss terms whose sum is minimised
  (``loss``), so that logs show every term,
* optional hooks: ``on_train_start`` / ``on_epoch_start`` (prototype computation for NDPP / ODPP,
  the synthesised old classifier of BCT) and ``on_train_end`` (the adapter stage of λ-orthogonality),
* optional training-only modules trained jointly with the model (``build_auxiliary``: AdvBCT's
  discriminator), kept out of the deployed generation.

Hyperparameters are a pydantic model per method (``Params``) with the papers' defaults, so YAML,
Tune and the CLI all validate the same typed fields and reject unknown ones.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from orchestrator.methods.descriptions import MethodDescription
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.encoder import Encoder, EncoderConfig
from orchestrator.models.outputs import ModelOutput


@dataclass
class TrainContext:
    """What a method's loss and hooks can see about the generation being trained.

    new_model:   the model being trained (unwrapped, even when training runs under DDP).
    old_model:   the frozen parent generation, in eval mode, or None for a first generation.
    train_data:  the full training set of this generation, *without* augmentation, yielding
                 ``(image (3,H,W), label, id)``; hooks use it to compute class prototypes.
    num_classes: size of the label space of this generation (labels are in [0, num_classes)).
    device:      where the models live.
    epoch:       0-based index of the current epoch (updated by the training loop).
    epochs:      total number of epochs of this training (for schedules, e.g. AdvBCT's gradient
                 reversal), or None where the caller does not say.
    batch_size:  batch size for the hooks' full passes over ``train_data``.
    state:       per-method scratch space (prototypes, synthesised classifiers, ...).
    pair_data:   the items a post-hoc map's paired sample is drawn from (the gallery's), items as
                 ``train_data``'s; None: ``train_data``.
    """

    new_model: CompatibleModel
    old_model: CompatibleModel | None
    train_data: Dataset
    num_classes: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    epoch: int = 0
    epochs: int | None = None
    batch_size: int = 256
    state: dict[str, Any] = field(default_factory=dict)
    pair_data: Dataset | None = None

    @torch.no_grad()
    def embed_train_data(self, model: CompatibleModel) -> tuple[ModelOutput, torch.Tensor]:
        """Embed every training item with ``model`` in eval mode.

        Returns the concatenated ``ModelOutput`` (features (N, d), embedding (N, d or d+1),
        logits (N, C)) and the labels (N,). The model's train/eval mode is restored afterwards.
        """
        return embed_dataset(model, self.train_data, self.batch_size, self.device)


def embed_dataset(
    model: CompatibleModel, data: Dataset, batch_size: int = 256, device: torch.device | str = "cpu"
) -> tuple[ModelOutput, torch.Tensor]:
    """Run ``model`` over ``data`` (items ``(image, label, id)``) in eval mode, without gradients.

    Returns ``(ModelOutput with features (N, d), embedding (N, ·), logits (N, C)), labels (N,))``
    on ``device``.
    """
    output, labels, _ids = embed_dataset_with_ids(model, data, batch_size, device)
    return output, labels


@torch.no_grad()
def embed_dataset_with_ids(
    model: CompatibleModel, data: Dataset, batch_size: int = 256, device: torch.device | str = "cpu"
) -> tuple[ModelOutput, torch.Tensor, torch.Tensor]:
    """As ``embed_dataset``, also returning the item ids (N,) int64. The model's train/eval mode is
    restored afterwards."""
    was_training = model.training
    model.eval()
    features, embeddings, logits, labels, ids = [], [], [], [], []
    try:
        for images, batch_labels, batch_ids in DataLoader(data, batch_size=batch_size, shuffle=False):
            out = model(images.to(device))
            features.append(out.features)
            embeddings.append(out.embedding)
            logits.append(out.logits)
            labels.append(batch_labels.to(device))
            ids.append(batch_ids)
    finally:
        model.train(was_training)
    if not labels:
        raise ValueError("embed_dataset: the dataset is empty")
    output = ModelOutput(torch.cat(features), torch.cat(embeddings), torch.cat(logits))
    return output, torch.cat(labels), torch.cat(ids)


class CompatibilityMethod(MethodDescription, ABC):
    """A backward-compatible training method behind the shared protocol (see module docstring).

    Subclasses set ``name``, ``Params``, ``summary``, ``requires_parent`` and
    ``requires_parent_embed_dim`` and implement ``space``, ``build_head`` and ``loss``.
    ``requires_parent`` is True for methods whose whole objective is alignment to a parent (l2,
    bct, ...); methods with a parent-free base objective (hbct, dsimplex, binary_hyperbolic,
    independent) train a first generation with it alone.
    ``requires_parent_embed_dim`` is True for methods that, given a parent, compare the new
    model's embeddings with the parent's directly (a distance or similarity between new and old
    vectors, the parent's classifier, class centres or prototypes applied to new embeddings, a
    head shared with the parent): the new generation's ``model.embed_dim`` must then equal its
    parent's, which the pipeline file's validation checks before any training. False for methods
    that ignore the parent while training (independent) or bridge the two spaces with learned
    adapters from the parent's dimension to the new one (fct, lambda_orth). The default, True,
    is the safe one for a plug-in that does not say: a mismatch is refused when the pipeline
    file loads instead of failing when the generation's training starts.
    ``requires_embed_dim_at_least_parents`` is True for a method whose served queries reach the
    parent's index through a backward adapter that keeps at most the new generation's
    coordinates (lambda_orth's B: the common prefix min(d, n)); the full-width index of a wider
    parent cannot be searched with them, so validation refuses a narrower child.
    ``replacement_keeps_parent_embed_dim`` is True for a method whose generations share one fixed
    structure of the embedding's size across the whole chain (dsimplex: K prototypes in R^(K−1)),
    so that a replacement, which otherwise aligns to the checkpoint it starts from, must keep its
    parent's embed_dim too. ``check_embed_dim`` refuses a size the parameters cannot build.
    """

    # --- geometry (``space``, ``curv``, ``check_embed_dim``: ``MethodDescription``) ------------
    def build_lift(self) -> nn.Module:
        """The space lift applied after the encoder's projection."""
        from orchestrator.models.lifts import build_lift

        return build_lift(self.space, curv=self.curv)

    @abstractmethod
    def build_head(self, embed_dim: int, num_classes: int) -> nn.Module:
        """The classification head trained with the base loss, over ``num_classes`` labels."""

    def build_auxiliary(self, embed_dim: int, num_classes: int) -> dict[str, nn.Module]:
        """Training-only modules this method trains jointly with the model (default: none).

        They become ``model.auxiliary`` (built after the encoder and head, so those draw the same
        random initialisation as without them): the optimiser, DDP and epoch checkpoints see them
        like any other weight; ``loss`` reaches them as ``ctx.new_model.auxiliary[name]``. A
        deployed generation never contains them (``CompatibleModel.deployable_state_dict``).
        Under DDP every auxiliary parameter must take part in every step's loss.
        """
        return {}

    def build_model(
        self, encoder_config: EncoderConfig, num_classes: int, seen_classes: torch.Tensor
    ) -> CompatibleModel:
        """A fresh model of this method: encoder (backbone, projection, lift), head and the
        method's training-only auxiliary modules."""
        encoder = Encoder(encoder_config, self.build_lift())
        head = self.build_head(encoder_config.embed_dim, num_classes)
        auxiliary = self.build_auxiliary(encoder_config.embed_dim, num_classes)
        return CompatibleModel(encoder, head, seen_classes=seen_classes, auxiliary=auxiliary)

    # --- objective --------------------------------------------------------------------------
    @abstractmethod
    def loss(
        self,
        new: ModelOutput,
        old: ModelOutput | None,
        labels: torch.Tensor,
        ctx: TrainContext,
    ) -> dict[str, torch.Tensor]:
        """Named, already-weighted loss terms for one batch; training minimises their sum.

        new:    output of the model being trained, with logits (B, C).
        old:    output of the frozen parent on the same (same-view) batch, or None.
        labels: (B,) int64 class ids in [0, ctx.num_classes).
        """

    # --- hooks ------------------------------------------------------------------------------
    def on_train_start(self, ctx: TrainContext) -> None:
        """Called once before the first epoch (e.g. old prototypes, BCT's old classifier)."""

    def on_epoch_start(self, ctx: TrainContext) -> None:
        """Called before every epoch, ``ctx.epoch`` set (e.g. NDPP / ODPP prototype refresh)."""

    def on_train_end(self, ctx: TrainContext) -> None:
        """Called once after the last epoch (e.g. fit λ-orthogonality adapters on the model)."""

    # --- the unaligned models of the same geometry (``orchestrator.methods.references``) -------
    def own_reference(self) -> CompatibilityMethod | None:
        """φ_* when this method is its own reference: a method with a parent-free base objective,
        trained with no parent, its ``parent_only_params`` at their defaults (they do not act
        without a parent); None for a parent-aligned method, whose reference is another method's
        model (``references.reference_method``)."""
        if self.requires_parent:
            return None
        fields = type(self.params).model_fields
        return type(self)(self.params.model_copy(update={f: fields[f].default for f in self.parent_only_params}))

    def own_parent(self) -> CompatibilityMethod | None:
        """The method of a first (old) generation this method aligns to, when it is not the
        reference (``references.parent_method``); None (the default): the reference trains it."""
        return None

    def describe(self) -> dict[str, Any]:
        """Name, space and parameter values, JSON-serialisable (for cards and the lineage)."""
        return {"name": self.name, "space": self.space.value, "params": self.params.model_dump()}
