"""Errors of the lineage store that callers (the CLI) tell apart from database failures."""
from __future__ import annotations


class LineageNotFound(LookupError):
    """A reader opened a lineage store that does not exist (no file, or a database without the
    lineage schema); nothing was created."""


class LineageBusy(Exception):
    """Another process holds the pipeline's run lock; the message names the holder."""
