"""Index layer: one FAISS index per gallery shard, searched in the generation's embedding space.

No Ray here (plain numpy / faiss / torch). ``build_index(embeddings, space, kind, ids=..., curv=...,
**options)`` builds any kind of ``ALL_KINDS`` and ``load_index(uri)`` reads any of them back
(``factory``): the float kinds of ``shard_index`` (exact space distances), the binary hyperbolic
kinds of ``binary_index`` (bit-plane codes, ``bitplane``) and the product-quantised kinds of
``pq_index``.
"""

from orchestrator.index.binary_index import BINARY_KINDS, BinaryIndex, build_binary_index
from orchestrator.index.bitplane import BitPlaneQuantizer
from orchestrator.index.factory import ALL_KINDS, OPTIONS, AnyIndex, build_index, index_from_bytes, load_index
from orchestrator.index.pq_index import PQ_KINDS, PQIndex, build_pq_index
from orchestrator.index.shard_index import (
    FORMAT_VERSION,
    KINDS,
    MAGIC,
    IndexKind,
    ShardIndex,
    default_nlist,
)

__all__ = [
    "ALL_KINDS",
    "BINARY_KINDS",
    "FORMAT_VERSION",
    "KINDS",
    "MAGIC",
    "OPTIONS",
    "PQ_KINDS",
    "AnyIndex",
    "BinaryIndex",
    "BitPlaneQuantizer",
    "IndexKind",
    "PQIndex",
    "ShardIndex",
    "build_binary_index",
    "build_index",
    "build_pq_index",
    "default_nlist",
    "index_from_bytes",
    "load_index",
]
