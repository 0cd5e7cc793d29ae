"""What each pipeline step ran from: the part of the config that can change its results.

Every step records its spec when it starts (``LineageStore.start_step(spec=...)``; kept with the
committed outputs). A re-run whose spec for a committed step differs is refused, naming the step
and the changed fields (``ChangedStepSpec``), instead of skipping the step and silently keeping
results the file no longer describes. Fields that cannot change results are left out: the Ray
settings, the embedding actors' batch size, pool size and resources, the gate's action, the
search depth of the report and ``data.scenario`` (a label checked against the generations; specs
recorded before it was left out are read without it, ``NOT_COUNTED``). A recorded spec is read
with today's defaults for settings added since (``recorded_spec``).

- ``train:<gen>``: the generation (all but its backfill policy, gate and health check: a
  committed generation passed the check it ran with), the data settings of
  training, and the parent's checkpoint sha256 (its identity), and that of the generation whose
  encoder it takes (``encoder_from``);
- ``evaluate:<gen>``: the data settings of the evaluation split and the evaluation sample
  (``evaluation.eval_sample``); the other evaluation settings change the gallery steps or the
  report's summaries (the reference), not the stored embeddings or cells;
- ``plan:<gallery>:<gen>``: the gallery (source, split, shards, index) and the backfill policy; the
  shard updates, deployment and report of the generation follow from the plan.
"""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from orchestrator.config import BackfillPolicy, DataSettings, EvaluationSpec, GallerySpec, GenerationSpec, PipelineConfig
from orchestrator.errors import UsageError


class ChangedStepSpec(UsageError, ValueError):
    """A committed step's recorded spec differs from what the file now says."""

    def __init__(self, key: str, fields: list[str], generation: str):
        self.key, self.fields = key, fields
        super().__init__(
            f"step {key!r} was committed with other settings; changed: {', '.join(fields)}. Its results "
            f"(and everything after it) came from the old ones: give generation {generation!r} a new name "
            "(the old one stays in the lineage), or put the old values back")


TRAINING_ONLY = {"train_split", "train_per_class", "task_splits"}
NOT_COUNTED = {"scenario"}  # data fields that change no result, left out of every spec


def train_spec(config: PipelineConfig, generation: GenerationSpec, parent_sha256: str | None,
               encoder_sha256: str | None = None) -> dict[str, Any]:
    data = config.data.model_dump(mode="json", include={"source", "options", "split_options", "image_size"} | TRAINING_ONLY)
    spec = {"generation": generation.model_dump(mode="json", exclude={"backfill", "gate", "health"}), "data": data,
            "parent_sha256": parent_sha256}
    if generation.encoder_from is not None:  # the given encoder's identity
        spec["encoder_sha256"] = encoder_sha256
    return spec


def evaluate_spec(config: PipelineConfig) -> dict[str, Any]:
    """Every data setting but the training-only ones (new ones count by default), and the sample."""
    return {"data": config.data.model_dump(mode="json", exclude=TRAINING_ONLY | NOT_COUNTED),
            "evaluation": config.evaluation.model_dump(mode="json", include={"eval_sample"})}


def plan_spec(config: PipelineConfig, generation: GenerationSpec) -> dict[str, Any]:
    gallery = config.gallery.model_dump(mode="json", exclude={"embedding"})
    return {"gallery": gallery, "backfill": generation.backfill.model_dump(mode="json")}


#: Each section of a spec and the model that validates it.
SECTION_MODELS = {"generation": GenerationSpec, "data": DataSettings, "gallery": GallerySpec,
                  "backfill": BackfillPolicy, "evaluation": EvaluationSpec}


def recorded_spec(recorded: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """The spec a step recorded, read as today's code would have recorded it, to compare with
    ``current``: each section validated again by its model (``SECTION_MODELS``), so that a setting
    added since is read at its default (the behaviour the step ran with), and kept to the fields
    ``current`` has (a field that no longer counts, e.g. ``NOT_COUNTED``, is left out). A section
    that no longer validates is compared as recorded."""
    normalised = dict(recorded)
    for section, model in SECTION_MODELS.items():
        if not (isinstance(recorded.get(section), dict) and isinstance(current.get(section), dict)):
            continue
        try:
            full = model.model_validate(recorded[section]).model_dump(mode="json")
        except ValidationError:
            continue
        normalised[section] = {key: full[key] for key in current[section] if key in full}
    return normalised


def changed_fields(recorded: Any, current: Any, path: str = "") -> list[str]:
    """Dotted paths where two JSON values differ (a whole list when its length or an item differs)."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        fields = []
        for key in sorted(set(recorded) | set(current)):
            where = f"{path}.{key}" if path else str(key)
            if key not in recorded or key not in current:
                fields.append(where)
            else:
                fields += changed_fields(recorded[key], current[key], where)
        return fields
    return [] if recorded == current else [f"{path} ({_short(recorded)} → {_short(current)})"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
