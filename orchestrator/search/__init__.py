"""Search over mixed-generation galleries: route the serving generation's queries to every shard
along its compatibility path, refuse shards it is not compatible with, merge the top-k.

No Ray here: a router is plain Python over FAISS indexes and PyTorch models; ``orchestrator
search`` and the pipeline's evaluation build one from the lineage.
"""
from orchestrator.search.admission import CompatibilityCriterion, Verdict
from orchestrator.search.router import (
    IncompatibleShards,
    SearchResult,
    SearchRouter,
    SkippedShard,
    merge_top_k,
)
from orchestrator.search.service import SearchService, open_router, service_for_pipeline

__all__ = [
    "CompatibilityCriterion",
    "IncompatibleShards",
    "SearchResult",
    "SearchRouter",
    "SearchService",
    "SkippedShard",
    "Verdict",
    "merge_top_k",
    "open_router",
    "service_for_pipeline",
]
