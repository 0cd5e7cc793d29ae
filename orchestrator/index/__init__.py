"""Index layer: one FAISS index per gallery shard, searched in the generation's embedding space.

No Ray here (plain numpy / faiss); see ``shard_index`` for the metric used per space.
"""

from orchestrator.index.shard_index import (
    FORMAT_VERSION,
    KINDS,
    MAGIC,
    IndexKind,
    ShardIndex,
    build_index,
    default_nlist,
)

__all__ = ["FORMAT_VERSION", "KINDS", "MAGIC", "IndexKind", "ShardIndex", "build_index", "default_nlist"]
