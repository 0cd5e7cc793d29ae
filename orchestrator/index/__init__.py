"""Index layer: one FAISS index per gallery shard, searched in the generation's embedding space.

No Ray here (plain numpy / faiss / torch). ``build_index(embeddings, space, kind, ids=..., curv=...,
**options)`` builds any kind of ``ALL_KINDS`` and ``load_index(uri)`` reads any of them back
(``factory``): the float kinds of ``shard_index`` (exact space distances), the binary hyperbolic
kinds of ``binary_index`` (bit-plane codes, ``bitplane``) and the product-quantised kinds of
``pq_index``.
"""

from orchestrator.lazy_exports import lazy_exports

# Imported on first use: the kinds and their options (``kinds``) are read by the validation of
# pipeline files, which imports no torch; the indexes need numpy, faiss and torch.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "binary_index": ["BinaryIndex", "build_binary_index"],
    "bitplane": ["BitPlaneQuantizer"],
    "factory": ["build_index", "index_from_bytes", "load_index"],
    "kinds": ["ALL_KINDS", "BINARY_KINDS", "OPTIONS", "PQ_KINDS"],
    "pq_index": ["PQIndex", "build_pq_index"],
    "protocol": ["ShardSearch", "StoredIndex"],
    "shard_index": ["FORMAT_VERSION", "KINDS", "MAGIC", "IndexKind", "ShardIndex", "default_nlist"],
})
