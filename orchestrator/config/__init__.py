"""Pipeline files: typed models of the YAML that ``orchestrator run`` executes, and their loader.

A pipeline file names where results go (``storage``: a local path or ``s3://``), the lineage store
(``lineage``: a SQLAlchemy URL, SQLite under the storage by default), the Ray cluster (``ray``), the
training data and update scenario (``data``), the served gallery (``gallery``), how generations are
compared (``evaluation``) and the list of model ``generations`` in training order, each with its
parent, encoder, compatibility method and hyperparameters, training settings, training items and
backfill policy. ``pipelines/lifelong.yaml`` is the commented reference.

Every model forbids unknown fields, so a typo is an error rather than a silently ignored default.
``load_pipeline`` reads a file with ``orchestrator.bounded_yaml`` (``yaml.safe_load`` within the
bounds of ``orchestrator.limits``) and turns every problem into one line naming
the file, the field path and the bad value::

    pipelines/x.yaml: generations[1].method.params.lam: Input should be greater than or equal to 0 (got -1) [line 23]

The method parameters are validated by the method's own ``Params`` model (``orchestrator.methods``),
so YAML, Tune and the CLI share one definition and the papers' defaults. Cross-field rules
(unique names, parents defined before their children, the evaluation reference, ...) are checked
here; whether a parent's and a child's embedding spaces can be searched together is checked by the
pipeline when it builds the models.

The package, a module a job:
- ``problems``: ``PipelineConfigError``, the problem records validators raise, ``StrictModel``.
- ``yaml_errors``: reading a YAML file and turning every problem into one line.
- ``sources``: a data source's loader options checked against ``orchestrator.data.registry``.
- ``data``, ``gallery``, ``generation``, ``deployment``, ``evaluation``, ``runtime``: the models
  of the file's sections (``deployment``: a generation's backfill policy and gate; ``runtime``:
  ``ray`` and ``tracking``).
- ``pipeline``: ``PipelineConfig`` (the cross-section rules) and ``config_sha256``.
- ``loading``: ``load_pipeline`` with the command line's overrides.
Which training items a generation selects is the data layer's: ``orchestrator.data.training_indices``.

Decisions:
- Relative local paths (storage, SQLite lineage, data roots) are relative to the working directory,
  not to the YAML file, as ``orchestrator run pipelines/x.yaml`` is run from a project root.
- Multi-step tasks are counted from 1, as the papers do ("replacements at tasks 3 and 5",
  stationary_dsimplex.md §6.2); ``classes: {task: 0}`` is an error.
- ``training.augment`` (per generation) is the only augmentation switch; the data block has none.
- Overrides (CLI ``--storage``, ``--ray-address``) are applied to the raw YAML before validation,
  so an override is validated exactly like the file; a ``None`` override value means "not given".
- ``config_sha256`` hashes the validated, normalised config (defaults filled in, method parameters
  completed by the method's ``Params``), so key order, comments and spelled-out defaults do not
  change it and any effective value does.
"""
from orchestrator.config.data import SCENARIOS, DataSettings, ScenarioName, TaskSplits
from orchestrator.config.deployment import BackfillPolicy, GateSpec
from orchestrator.config.evaluation import EvaluationSpec, SearchSpec
from orchestrator.config.gallery import EmbeddingSpec, GallerySpec
from orchestrator.config.generation import ClassSelection, GenerationSpec, MethodSpec
from orchestrator.config.loading import load_pipeline
from orchestrator.config.pipeline import (
    LINEAGE_SCHEMES,
    RUNTIME_SECTIONS,
    STORAGE_SCHEMES,
    PipelineConfig,
    config_sha256,
)
from orchestrator.config.problems import (
    PipelineConfigError,
    StrictModel,
    field_path,
    problem,
    problems_from,
    raise_problems,
    suggest,
    unwrap,
)
from orchestrator.config.runtime import TRACKING_SCHEMES, RaySettings, TrackingSettings
from orchestrator.config.yaml_errors import read_yaml_mapping, validate_yaml_mapping

__all__ = [
    "LINEAGE_SCHEMES",
    "RUNTIME_SECTIONS",
    "SCENARIOS",
    "STORAGE_SCHEMES",
    "TRACKING_SCHEMES",
    "BackfillPolicy",
    "ClassSelection",
    "DataSettings",
    "EmbeddingSpec",
    "EvaluationSpec",
    "GallerySpec",
    "GateSpec",
    "GenerationSpec",
    "MethodSpec",
    "PipelineConfig",
    "PipelineConfigError",
    "RaySettings",
    "ScenarioName",
    "SearchSpec",
    "StrictModel",
    "TaskSplits",
    "TrackingSettings",
    "config_sha256",
    "field_path",
    "load_pipeline",
    "problem",
    "problems_from",
    "raise_problems",
    "read_yaml_mapping",
    "suggest",
    "unwrap",
    "validate_yaml_mapping",
]
