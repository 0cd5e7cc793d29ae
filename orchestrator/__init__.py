"""Orchestrator for continual, backward-compatible embedding-model updates."""
