"""Search over mixed-generation galleries: route the serving generation's queries to every shard
along its compatibility path, refuse shards it is not compatible with, merge the top-k.

No Ray here: a router is plain Python over FAISS indexes and PyTorch models; ``orchestrator
search`` and the pipeline's evaluation build one from the lineage. Names are imported on first
use (``orchestrator.lazy_exports``), so the command line's parser (``search.cli``) does not
import torch.
"""
from orchestrator.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "admission": ["CompatibilityCriterion", "Verdict"],
    "router": ["IncompatibleShards", "RoutePlan", "SearchResult", "SearchRouter", "ShardHits", "SkippedShard", "merge_top_k",
               "plan_routes", "search_merged", "search_shards"],
    "service": ["SearchService", "open_plan", "open_router", "service_for_pipeline"],
})
