"""Galleries: the item → shard layout, the Parquet shard files, and the evaluation of a gallery
whose shards hold embeddings of different generations.

No Ray here; ``orchestrator.pipeline.gallery.updater`` drives these from the pipeline.
"""
from orchestrator.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "layout": ["home_shards", "shard_members"],
    "mixed_evaluation": ["MixedGalleryResult", "comparable_shards", "evaluate_mixed_gallery"],
    "shard_files": ["ShardEmbeddings", "read_recorded_attributes", "read_recorded_shard", "read_shard", "shard_file_uris",
                    "write_shard"],
})
