"""One entry of ``generations``: the encoder, the compatibility method, the training items and
settings, and the deployment rules (``orchestrator.config.deployment``)."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator

from orchestrator import limits
from orchestrator.config import posthoc
from orchestrator.config.architectures import unknown_architectures
from orchestrator.config.deployment import BackfillPolicy, GateSpec
from orchestrator.config.problems import StrictModel, problem, problems_from, raise_problems, suggest
from orchestrator.geometry.spaces import Space
from orchestrator.methods.descriptions import MethodDescription
from orchestrator.methods.registry import available_methods, create_method, method_description
from orchestrator.models.encoder_config import HUB, EncoderConfig
from orchestrator.names import Name
from orchestrator.training.config import HealthSpec, TrainConfig


class ClassSelection(StrictModel):
    """Which classes (and items) a generation trains on; ``classes: null`` (the default) is all.

    Exactly one of:
    - ``ids``: explicit class ids; in YAML simply ``classes: [0, 1, 2]``.
    - ``first_fraction``: the first ceil(f·C) classes by class index (extended-class, hbct.md §10).
    - ``task``: cumulative classes of tasks 1..task of ``data.task_splits`` (counted from 1). With
      ``memory_per_class`` m, the items of task ``task``'s own classes plus m items of each earlier
      class (an episodic memory, stationary_dsimplex.md §6.3; drawn once per class, seeded, so a
      class keeps the same memory items in every later task); without it, all items of all
      classes seen so far.
    - ``memory_per_class``: with ``task``, the episodic memory size m above.
    """

    ids: list[Annotated[int, Field(ge=0, lt=limits.MAX_CLASSES)]] | None = Field(
        None, min_length=1, max_length=limits.MAX_CLASSES)
    first_fraction: float | None = Field(None, gt=0, le=1)
    task: int | None = Field(None, ge=1, le=limits.MAX_CLASSES)
    memory_per_class: int | None = Field(None, ge=1, le=limits.MAX_ITEMS)

    @model_validator(mode="before")
    @classmethod
    def _list_is_ids(cls, value: Any) -> Any:
        return {"ids": value} if isinstance(value, (list, tuple)) else value

    @model_validator(mode="after")
    def _one_rule(self) -> ClassSelection:
        given = [name for name in ("ids", "first_fraction", "task") if getattr(self, name) is not None]
        problems = []
        if len(given) != 1:
            problems.append(problem((), "give exactly one of: a list of class ids, {first_fraction: f} or {task: i}"
                                    + (f" (got {', '.join(given)})" if given else "")))
        if self.memory_per_class is not None and self.task is None:
            problems.append(problem(("memory_per_class",), "applies to {task: i} selections only", self.memory_per_class))
        if self.ids is not None and len(set(self.ids)) != len(self.ids):
            problems.append(problem(("ids",), "class ids must be unique", self.ids))
        raise_problems(problems)
        return self


class MethodSpec(StrictModel):
    """A compatibility method by registry name with its hyperparameters.

    name:   the method's registry name (``orchestrator methods`` lists them).
    params: the method's hyperparameters (its ``Params``; the section "Method parameters" below).

    ``params`` is validated by the method's own ``Params`` model (papers' defaults for missing
    fields, unknown ones rejected) and stored completed, so the config records every value used.
    """

    name: str
    params: dict[str, Any] = Field(default_factory=dict, validate_default=True)  # completed when left out too

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        known = list(available_methods())
        if name not in known:
            raise ValueError(f"unknown method{suggest(name, known)}; known methods: {', '.join(known)}")
        return name

    @field_validator("params", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("params")
    @classmethod
    def _validate_params(cls, params: dict[str, Any], info: Any) -> dict[str, Any]:
        name = info.data.get("name")
        if name is None:  # the name itself is invalid, reported on its own
            return params
        model = method_description(name).Params
        try:
            return model.model_validate(params).model_dump(mode="json")
        except ValidationError as err:
            raise_problems(problems_from(err, model))
            raise  # unreachable: the error always has at least one problem

    def create(self):
        """The method instance (``orchestrator.methods.create_method``; imports torch)."""
        return create_method(self.name, self.params)

    def describe(self) -> MethodDescription:
        """The method's description with these parameters (``method_description``; no torch)."""
        return method_description(self.name)(self.params)

    @property
    def requires_parent(self) -> bool:
        return method_description(self.name).requires_parent

    @property
    def space(self) -> Space:
        """The embedding space the method trains in with these parameters."""
        return self.describe().space

    @property
    def requires_parent_embed_dim(self) -> bool:
        """Whether, given a parent, the method compares the new embeddings with the parent's
        directly, so that a child's ``model.embed_dim`` must equal its parent's."""
        return method_description(self.name).requires_parent_embed_dim

    @property
    def requires_embed_dim_at_least_parents(self) -> bool:
        """Whether the child's queries search the parent's index through an adapter that keeps at
        most the child's coordinates, so that a child narrower than its parent cannot be served."""
        return method_description(self.name).requires_embed_dim_at_least_parents

    @property
    def replacement_keeps_parent_embed_dim(self) -> bool:
        """Whether a replacement of this method must keep its parent's embed_dim too (one structure
        of that size shared by the whole chain, e.g. dsimplex's fixed classifier)."""
        return method_description(self.name).replacement_keeps_parent_embed_dim


class GenerationSpec(StrictModel):
    """One model generation: what it trains on, how, and what it must stay compatible with.

    name:             unique, a safe path component (``orchestrator.names``: used in paths and the lineage).
    parent:           the generation this one is aligned to (its gallery shards stay searchable),
                      defined earlier in the list; None for a first generation or a reference.
    model:            the encoder (``EncoderConfig``: timm arch, embed_dim, pretrained local path).
    method:           the compatibility method and its parameters.
    training:         optimiser, schedule, epochs, batch size, augmentation, seed (``TrainConfig``).
    classes:          the training classes (``ClassSelection``); None = all.
    data_fraction:    a class-stratified random fraction of the selected items (extended-data,
                      hbct.md §10: 0.3), drawn with ``data_seed``.
    data_seed:        the seed of the ``data_fraction`` draw.
    init_from_parent: start from the parent's weights (sequential fine-tuning, IAM-CL²R
                      stationary_dsimplex.md §6.3) instead of ``model.pretrained`` / random init;
                      needs the parent's architecture and embedding size.
    encoder_from:     a generation defined earlier whose encoder this one takes unchanged and
                      frozen, for a method that trains no encoder (``procrustes``,
                      ``low_rank_affine``, ``residual_mlp``): only a map to the parent is fitted, on
                      a paired sample (``orchestrator.config.posthoc``). Such a method may instead take
                      ``model.pretrained`` (a local file).
    replaces:         an asynchronous model replacement (stationary_dsimplex.md §6.1): the encoder
                      starts from a third-party pretrained checkpoint (``model.pretrained``, a local
                      path) and is fine-tuned to stay compatible with its parent's gallery.
                      Decision (§6.3 [C]): the frozen model of the alignment term is the checkpoint
                      this generation starts from, as in the released code.
    backfill:         the backfill policy applied when this generation is deployed.
    gate:             what must hold before it serves, and what happens otherwise (``GateSpec``).
    health:           whether it learns, checked while it trains and when it ends (``HealthSpec``):
                      a generation that does not stops at ``train:<gen>`` (exit code 7).
    """

    name: Name
    parent: str | None = None
    model: EncoderConfig = Field(default_factory=EncoderConfig)
    method: MethodSpec
    training: TrainConfig = Field(default_factory=TrainConfig)
    classes: ClassSelection | None = None
    data_fraction: float = Field(1.0, gt=0, le=1)
    data_seed: int = 0
    init_from_parent: bool = False
    encoder_from: str | None = None
    replaces: bool = False
    backfill: BackfillPolicy = Field(default_factory=BackfillPolicy)
    gate: GateSpec = Field(default_factory=GateSpec)
    health: HealthSpec = Field(default_factory=HealthSpec)

    @model_validator(mode="after")
    def _check_generation(self) -> GenerationSpec:
        problems = []
        if self.replaces:
            if self.model.pretrained in (None, HUB):
                problems.append(problem(("model", "pretrained"), "a replacement (replaces: true) starts from a third-party "
                                        "checkpoint: give its local path", self.model.pretrained))
            if self.init_from_parent:
                problems.append(problem(("init_from_parent",), "a replacement starts from model.pretrained, not from its parent", True))
        problems += posthoc.generation_problems(self)
        if self.init_from_parent and self.model.pretrained is not None:
            problems.append(problem(("model", "pretrained"), "unused with init_from_parent: true (the parent's weights are loaded)",
                                    self.model.pretrained))
        raise_problems(problems)
        return self


def architecture_problems(generations: list[GenerationSpec]) -> list[dict[str, Any]]:
    """``model.arch`` of every generation that is not a timm model name, with the nearest names.

    Asking timm imports torch and torchvision (several seconds of CPU): the pipeline file's
    validation asks last, once every other field is valid, so that any other error answers at
    once (``PipelineConfig``), and ``architectures`` answers from a list cached per timm version."""
    unknown = unknown_architectures(sorted({gen.model.arch for gen in generations}))
    return [problem(("generations", i, "model", "arch"), f"not a timm model name{suggest(gen.model.arch, unknown[gen.model.arch])}",
                    gen.model.arch)
            for i, gen in enumerate(generations) if gen.model.arch in unknown]
