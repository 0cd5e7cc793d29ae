"""Lineage store: generations, galleries and shards, backfills, compatibility values,
deployments, pipeline steps and sweep candidates (see ``store.py`` for the write protocol)."""
from orchestrator.lineage.render import lineage_json, lineage_tree_text
from orchestrator.lineage.store import LineageStore

__all__ = ["LineageStore", "lineage_json", "lineage_tree_text"]
