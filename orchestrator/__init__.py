"""Orchestrator for continual, backward-compatible embedding-model updates."""

__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)
