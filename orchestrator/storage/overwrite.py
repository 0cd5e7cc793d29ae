"""The rule that keeps files the lineage does not know: a step on its first attempt never
overwrites an existing file (no earlier attempt of that step can have written it, so it belongs to
something the lineage does not record: another run, a lost lineage, a user's own file).

A pure function of the location and the attempt, so that whoever writes (the driver, or a Ray
worker on another node that cannot reach the lineage) applies the same rule.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.storage.filesystem import exists, redact_uri


class UnknownArtefact(OrchestratorError, RuntimeError):
    """A file the lineage does not know is where a step would write."""


def refuse_file_on_first_attempt(key: str, uri: str, first_attempt: bool,
                        storage_options: Mapping[str, Any] | None = None) -> None:
    """UnknownArtefact when ``uri`` exists although step ``key`` is on its first attempt."""
    if first_attempt and exists(uri, storage_options):
        raise UnknownArtefact(f"{key}: {redact_uri(uri)} exists but the lineage does not know it; refusing to "
                              "overwrite it (move it away, or restore the lineage it belongs to)")
