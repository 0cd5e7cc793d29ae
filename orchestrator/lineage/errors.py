"""Errors of the lineage store that callers (the CLI) tell apart from database failures."""
from __future__ import annotations

from orchestrator.errors import ExitCode, OrchestratorError, UsageError


class LineageNotFound(UsageError, LookupError):
    """A reader opened a lineage store that does not exist (no file, or a database without the
    lineage schema); nothing was created."""

    reported_as = "error: LineageNotFound"


class LineageBusy(OrchestratorError):
    """Another process holds the pipeline's run lock; the message names the holder."""

    exit_code = ExitCode.BUSY
    reported_as = "busy"
