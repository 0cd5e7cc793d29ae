"""Lineage store: generations, galleries and shards, backfills, compatibility values,
deployments, pipeline steps and sweep candidates (see ``store.py`` for the write protocol)."""
from orchestrator.lineage.errors import LineageBusy, LineageNotFound
from orchestrator.lineage.render import lineage_json, lineage_tree_text
from orchestrator.lineage.store import LineageStore

__all__ = ["LineageBusy", "LineageNotFound", "LineageStore", "lineage_json", "lineage_tree_text"]
