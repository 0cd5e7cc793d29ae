"""Lineage store: generations, galleries and shards, backfills, compatibility values,
deployments, pipeline steps and sweep candidates (see ``store.py`` for the write protocol)."""
from orchestrator.lazy_exports import lazy_exports

# Imported on first use: the errors are read by the command line's error report, which imports
# no SQLAlchemy for an error that did not open a store.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "errors": ["LineageBusy", "LineageNotFound"],
    "render": ["lineage_json", "lineage_tree_text"],
    "store": ["LineageStore"],
})
