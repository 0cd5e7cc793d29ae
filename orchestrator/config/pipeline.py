"""A whole pipeline file (``PipelineConfig``): its sections, the defaults that depend on each
other (storage, lineage, tracking) and the cross-section rules; ``config_sha256`` identifies it."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import yaml
from pydantic import Field, field_validator, model_validator

from orchestrator import limits
from orchestrator.config import posthoc
from orchestrator.config.data import DataSettings
from orchestrator.config.evaluation import EvaluationSpec, SearchSpec
from orchestrator.config.gallery import GallerySpec
from orchestrator.config.generation import GenerationSpec, architecture_problems
from orchestrator.config.problems import StrictModel, problem, raise_problems, suggest
from orchestrator.config.runtime import RaySettings, TrackingSettings, local_path, url_scheme
from orchestrator.config.sources import check_options, check_split, missing_options
from orchestrator.data.registry import RAY_DATA, STREAMED_SOURCES, loader_kwargs
from orchestrator.geometry.spaces import Space
from orchestrator.names import Name

STORAGE_SCHEMES = ("file", "s3", "memory")
LINEAGE_SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")


class PipelineConfig(StrictModel):
    """A whole pipeline file (see the module docstring and ``pipelines/lifelong.yaml``).

    name:        the pipeline's name, a safe path component (``orchestrator.names``; the default
                 storage is ``./runs/<name>``).
    description: free text, shown nowhere else.
    storage: a local path or ``s3://bucket/prefix`` (also ``file://``; ``memory://`` for tests);
             default ``./runs/<name>``.
    lineage: a SQLAlchemy URL, ``sqlite:///path`` or ``postgresql+psycopg://...``; default a SQLite file
             ``lineage.db`` under a local storage (required with remote storage).
    tracking: optional MLflow experiment tracking (``TrackingSettings``; off by default).
    """

    name: Name
    description: str = ""
    storage: str | None = None
    lineage: str | None = None
    ray: RaySettings = Field(default_factory=RaySettings)
    data: DataSettings
    gallery: GallerySpec = Field(default_factory=GallerySpec)
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    search: SearchSpec = Field(default_factory=SearchSpec)
    generations: list[GenerationSpec] = Field(min_length=1, max_length=limits.MAX_GENERATIONS)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)

    @field_validator("storage")
    @classmethod
    def _check_storage(cls, storage: str | None) -> str | None:
        if storage is None:
            return None
        storage = storage.strip()
        if not storage:
            raise ValueError("expected a local path or an s3:// URL")
        scheme = url_scheme(storage)
        if scheme is not None and scheme not in STORAGE_SCHEMES:
            raise ValueError(f"unsupported storage scheme {scheme + '://'!r}; use a local path, "
                             f"{', '.join(s + '://' for s in STORAGE_SCHEMES)}")
        if scheme in ("s3", "memory") and not storage.split("://", 1)[1].strip("/"):
            raise ValueError(f"{scheme}:// needs a bucket / path")
        return storage.rstrip("/") or "/"

    @field_validator("lineage")
    @classmethod
    def _check_lineage(cls, lineage: str | None) -> str | None:
        if lineage is None:
            return None
        scheme = url_scheme(lineage.strip())
        if scheme not in LINEAGE_SCHEMES:
            raise ValueError("expected a database URL: sqlite:///path/lineage.db or postgresql+psycopg://user@host/db")
        return lineage.strip()

    @model_validator(mode="after")
    def _defaults_and_cross_checks(self) -> PipelineConfig:
        if self.storage is None:
            self.storage = f"./runs/{self.name}"
        from orchestrator.storage.filesystem import redact_uri  # fsspec: imported only when a file is validated

        storage = redact_uri(self.storage)
        problems = []
        if self.is_remote_storage and storage != self.storage:
            problems.append(problem(("storage",), "credentials in the URL are never used (nor shown); give them as "
                                    "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or an AWS profile", storage))
        if self.lineage is None:
            if self.is_remote_storage:
                problems.append(problem(("lineage",), f"required with remote storage ({storage}): SQLite cannot "
                                        "live on object storage; give sqlite:///<volume path> or postgresql+psycopg://..."))
            else:
                self.lineage = f"sqlite:///{local_path(self.storage).rstrip('/')}/lineage.db"
        problems += self._check_generations()
        problems += self._check_reference()
        problems += self._check_gallery()
        problems += self._check_scenario()
        problems += self._check_backfill_orders()
        problems += self._tracking_defaults()
        raise_problems(problems or architecture_problems(self.generations))  # timm only for an otherwise valid file
        return self

    def _check_generations(self) -> list[dict[str, Any]]:
        problems = []
        position: dict[str, int] = {}
        for i, gen in enumerate(self.generations):
            if gen.name in position:
                problems.append(problem(("generations", i, "name"), f"duplicate generation name (also generations"
                                        f"[{position[gen.name]}])", gen.name))
            else:
                position[gen.name] = i
        for i, gen in enumerate(self.generations):
            where = ("generations", i)
            problems += _embed_dim_problems(gen, where)
            if gen.parent is None:
                if gen.method.requires_parent:
                    problems.append(problem((*where, "parent"), f"method {gen.method.name!r} aligns a model to its "
                                            "parent: name the parent generation", None))
                for flag in ("init_from_parent", "replaces"):
                    if getattr(gen, flag):
                        problems.append(problem((*where, flag), "needs a parent", True))
            elif gen.parent not in position:
                names = list(position)
                problems.append(problem((*where, "parent"), f"unknown generation{suggest(gen.parent, names)}; "
                                        f"generations: {', '.join(names)}", gen.parent))
            elif position[gen.parent] >= i:
                where_parent = "itself" if position[gen.parent] == i else f"generations[{position[gen.parent]}]"
                problems.append(problem((*where, "parent"), f"a parent must be defined before its child (it is "
                                        f"{where_parent}); list generations in training order", gen.parent))
            else:
                parent = self.generations[position[gen.parent]].model
                same = ("arch", "embed_dim", "in_chans", "small_input")
                if gen.init_from_parent and any(getattr(parent, k) != getattr(gen.model, k) for k in same):
                    problems.append(problem((*where, "init_from_parent"), f"needs the parent's architecture (parent "
                                            f"{gen.parent!r}: " + ", ".join(f"{k} {getattr(parent, k)!r}" for k in same)
                                            + ")", True))
                problems += _parent_embed_dim_problems(gen, parent, where)
            if gen.classes is not None and gen.classes.task is not None and self.data.task_splits is None:
                problems.append(problem((*where, "classes", "task"), "a task selection needs data.task_splits "
                                        "({first: ..., step: ...})", gen.classes.task))
        return problems + posthoc.lineage_problems(self.generations, self.gallery.source)

    def _check_backfill_orders(self) -> list[dict[str, Any]]:
        """``order: uncertainty`` scores the gallery's items by their hyperbolic uncertainty, so every
        generation served before it must embed in the Lorentz model (otherwise the plan failed
        after the earlier generations had trained and deployed)."""
        problems, served = [], self.served_generations
        for i, gen in enumerate(served):
            if gen.backfill.policy == "none" or gen.backfill.order != "uncertainty":
                continue
            try:
                flat = [(g.name, g.method.name, space.value) for g in served[:i]
                        if (space := g.method.space) is not Space.LORENTZ]
            except ValueError:  # a method's parameters are wrong: reported where they are checked
                continue
            if flat:
                name, method, space = flat[0]
                problems.append(problem(("generations", self.generations.index(gen), "backfill", "order"),
                                        f"needs hyperbolic (Lorentz) embeddings in the gallery, but {name!r} "
                                        f"({method}, space {space}) serves before it; use class_mean_distance, "
                                        "least_compatible or random", "uncertainty"))
        return problems

    def _check_reference(self) -> list[dict[str, Any]]:
        name = self.evaluation.reference
        if name is None:
            return []
        where = ("evaluation", "reference")
        names = list(dict.fromkeys(g.name for g in self.generations))
        if name not in names:
            return [problem(where, f"unknown generation{suggest(name, names)}; generations: {', '.join(names)}", name)]
        index = next(i for i, g in enumerate(self.generations) if g.name == name)
        reference = self.generations[index]
        problems = []
        if reference.parent is not None:
            problems.append(problem(where, f"the reference φ_* is an unaligned model, but {name!r} has the parent "
                                    f"{reference.parent!r}", name))
        children = [g.name for g in self.generations if g.parent == name]
        if children:
            problems.append(problem(where, f"the reference is never deployed, so it cannot be a parent (of "
                                    f"{', '.join(children)})", name))
        if reference.backfill.policy != "none":
            problems.append(problem(("generations", index, "backfill", "policy"),
                                    "the evaluation reference is never deployed: its backfill policy must be 'none'",
                                    reference.backfill.policy))
        return problems

    def _check_gallery(self) -> list[dict[str, Any]]:
        source, options = self.gallery_source
        same_source = self.gallery.source is None
        split_options = self.data.split_options if same_source else {}
        problems = []
        if self.gallery.options is not None:
            problems += check_options(source, self.gallery.options, ("gallery", "options"))
        if source not in STREAMED_SOURCES:
            problems += check_split(source, self.gallery.split, split_options, ("gallery", "split"))
        if not same_source or self.gallery.options is not None:
            missing = missing_options(source, {**options, **split_options.get(self.gallery.split, {})})
            if missing:
                problems.append(problem(("gallery", "options"), f"source {source!r} needs the option(s) {', '.join(missing)}"))
        if source == RAY_DATA and not problems:
            from orchestrator.data.ray_data_read import ReadOptionError, read_spec  # pyarrow: only for this source

            try:
                read_spec(options)
            except ReadOptionError as error:
                problems.append(problem(("gallery", "options", *error.field.split(".")), error.reason, error.value))
        used = {self.data.train_split, self.data.eval_split} | ({self.gallery.split} if same_source else set())
        for split in self.data.split_options:
            if split not in used:
                problems.append(problem(("data", "split_options", split), f"no split of this name is used (used: "
                                        f"{', '.join(sorted(used))})"))
        return problems

    def _check_scenario(self) -> list[dict[str, Any]]:
        scenario, gens = self.data.scenario, self.generations
        needs: list[str] = []
        if scenario in ("extended_class", "both") and not any(g.classes is not None for g in gens):
            needs.append("a generation trained on a class subset (classes: ...)")
        if scenario == "extended_data" and not any(g.data_fraction < 1 for g in gens):
            needs.append("a generation trained on a data fraction (data_fraction < 1)")
        if scenario in ("new_architecture", "both") and len({g.model.arch for g in gens}) < 2:
            needs.append("generations of at least two architectures (model.arch)")
        if scenario == "multi_step" and (
            self.data.task_splits is None or sum(g.classes is not None and g.classes.task is not None for g in gens) < 2
        ):
            needs.append("data.task_splits and at least two generations with classes: {task: i}")
        return [problem(("data", "scenario"), f"scenario {scenario!r} needs {' and '.join(needs)}", scenario)] if needs else []

    def _tracking_defaults(self) -> list[dict[str, Any]]:
        """The MLflow experiment defaults to the pipeline's name, the URI to a SQLite file under a
        local storage; remote storage needs an explicit URI (SQLite cannot live on object storage)."""
        tracking = self.tracking
        if tracking.experiment is None:
            tracking.experiment = self.name
        if tracking.uri is None and not self.is_remote_storage:
            tracking.uri = f"sqlite:///{local_path(self.storage).rstrip('/')}/mlflow.db"
        if tracking.uri is None and tracking.enabled:
            from orchestrator.storage.filesystem import redact_uri

            return [problem(("tracking", "uri"), f"required with remote storage ({redact_uri(self.storage)}) when "
                            "tracking is "
                            "enabled: give sqlite:///<volume path>/mlflow.db, postgresql://... or http(s)://<server>")]
        return []

    # --- conveniences for the pipeline ----------------------------------------------------------
    @property
    def is_remote_storage(self) -> bool:
        return url_scheme(self.storage or "") not in (None, "file")

    @property
    def gallery_source(self) -> tuple[str, dict[str, Any]]:
        """(source name, loader options) of the gallery (the data's unless the gallery names its own)."""
        if self.gallery.source is None:
            return self.data.source, dict(self.data.options if self.gallery.options is None else self.gallery.options)
        return self.gallery.source, dict(self.gallery.options or {})

    def gallery_loader_kwargs(self) -> tuple[str, dict[str, Any]]:
        """(source, kwargs) so that ``load_source(source, **kwargs)`` loads the gallery items."""
        source, options = self.gallery_source
        split_options = self.data.split_options if self.gallery.source is None else None
        return source, loader_kwargs(source, options, self.gallery.split, self.data.image_size, split_options)

    def generation(self, name: str) -> GenerationSpec:
        for gen in self.generations:
            if gen.name == name:
                return gen
        raise KeyError(f"no generation named {name!r}; generations: {', '.join(g.name for g in self.generations)}")

    def children(self, name: str) -> list[GenerationSpec]:
        return [g for g in self.generations if g.parent == name]

    @property
    def served_generations(self) -> list[GenerationSpec]:
        """The generations that are deployed, in order: all but the evaluation reference."""
        return [g for g in self.generations if g.name != self.evaluation.reference]

    def to_yaml(self) -> str:
        """The normalised config (defaults filled in) as YAML."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


RUNTIME_SECTIONS = ("ray", "tracking")  # where and how a run runs, not what it computes


def config_sha256(config: PipelineConfig, exclude: Iterable[str] = ()) -> str:
    """sha256 (hex) of the normalised config: canonical JSON (sorted keys) of every validated field.

    ``exclude`` leaves top-level fields out (e.g. ``RUNTIME_SECTIONS`` to identify a run
    independently of the cluster it runs on and of where it is tracked).
    """
    data = config.model_dump(mode="json", exclude=set(exclude) or None)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _embed_dim_problems(gen, where: tuple) -> list[dict[str, Any]]:
    """The generation's method refuses its ``model.embed_dim`` (``check_embed_dim``); none when its
    parameters are wrong, which is reported where they are checked."""
    try:
        method = gen.method.describe()
    except ValueError:
        return []
    try:
        method.check_embed_dim(gen.model.embed_dim)
    except ValueError as error:
        return [problem((*where, "model", "embed_dim"), str(error), gen.model.embed_dim)]
    return []


def _parent_embed_dim_problems(gen, parent, where: tuple) -> list[dict[str, Any]]:
    """The generation's ``model.embed_dim`` against its parent's model ``parent``, as its method
    declares (``CompatibilityMethod``): equal, at least the parent's, or free. A replacement aligns
    to the checkpoint it starts from (its own size), not to the parent, unless the method fixes
    the size for the whole chain."""
    method, size, parent_size = gen.method, gen.model.embed_dim, parent.embed_dim
    field, named = (*where, "model", "embed_dim"), f"(parent {gen.parent!r}: {parent_size})"
    if gen.replaces:
        if method.replacement_keeps_parent_embed_dim and size != parent_size:
            return [problem(field, f"method {method.name!r} fixes the embedding's size for the whole chain, a "
                                   f"replacement included, so it needs the parent's embed_dim {named}", size)]
        return []
    if method.requires_parent_embed_dim and size != parent_size:
        return [problem(field, f"method {method.name!r} compares this generation's embeddings with its parent's, "
                               f"so it needs the parent's embed_dim {named}", size)]
    if method.requires_embed_dim_at_least_parents and size < parent_size:
        return [problem(field, f"method {method.name!r} maps this generation's queries into its parent's index "
                               "with at most this generation's coordinates, so it needs at least the parent's "
                               f"embed_dim {named}", size)]
    return []
