"""Galleries: the item → shard layout, the Parquet shard files, and the evaluation of a gallery
whose shards hold embeddings of different generations.

No Ray here; ``orchestrator.pipeline.gallery_steps`` drives these from the pipeline.
"""
from orchestrator.gallery.layout import home_shards, shard_members
from orchestrator.gallery.mixed_evaluation import MixedGalleryResult, evaluate_mixed_gallery
from orchestrator.gallery.shard_files import ShardEmbeddings, read_shard, shard_file_uris, write_shard

__all__ = [
    "MixedGalleryResult",
    "ShardEmbeddings",
    "evaluate_mixed_gallery",
    "home_shards",
    "read_shard",
    "shard_file_uris",
    "shard_members",
    "write_shard",
]
