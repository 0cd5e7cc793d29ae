"""One shard update, done where its items are: read them, embed them, write the shard's Parquet
file and its FAISS index, and describe what was written (URIs, sha256s, counts) in a few hundred
bytes.

This is the per-item work of the gallery step. It runs in the stages of the step's Ray Data
pipeline on any node (``orchestrator.distributed.gallery_step``) and, the same functions, in a
plain process (tests, benchmarks). Nothing here imports Ray or reaches the lineage: the driver plans the updates, hands
each one to a worker with whether its step is on its first attempt, and commits the returned
description to the lineage; the commit alone makes the files served.
"""
from orchestrator.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "embedder": ["PixelEmbedder"],
    "files": ["ShardTarget", "WrittenShard", "write_shard_files"],
    "update": ["ShardUpdate", "UpdateKind"],
    "work": ["ShardUpdateResult", "embedded_part", "finish_shard_update", "run_shard_update"],
})
