"""The index kinds by name and the options each accepts, without numpy, faiss or torch (a pipeline
file's ``gallery.index`` is checked against them before any of those is imported)."""
from __future__ import annotations

#: ``ShardIndex`` (float, exact space distances; ``shard_index``).
SHARD_KINDS = ("flat", "ivf", "hnsw")
#: ``BinaryIndex`` (bit-plane codes, Hamming; ``binary_index``).
BINARY_KINDS = ("binary", "binary_weighted", "binary_two_stage", "binary_ivf")
#: The binary kinds a vector store with a Hamming distance searches (``stores.bits``; ``binary_ivf``
#: is FAISS's IVF over the codes, a store's own index over them is its ``store.index``).
HAMMING_KINDS = ("binary", "binary_weighted", "binary_two_stage")
#: ``PQIndex`` (product quantisation; ``pq_index``).
PQ_KINDS = ("pq", "opq", "binary_opq")

#: Every kind ``build_index`` accepts.
ALL_KINDS = SHARD_KINDS + BINARY_KINDS + PQ_KINDS

_SHARD_OPTIONS = ("nlist", "nprobe", "hnsw_m", "ef_construction", "ef_search", "refine_factor")
_QUANTISER_OPTIONS = ("bits", "clip_percentile")
_PQ_OPTIONS = ("pq_m", "pq_nbits", "train_size", "seed")
#: The keyword options of ``build_index`` per kind (beyond ``ids`` and ``curv``).
OPTIONS: dict[str, tuple[str, ...]] = {
    **{kind: _SHARD_OPTIONS for kind in SHARD_KINDS},
    "binary": _QUANTISER_OPTIONS,
    "binary_weighted": _QUANTISER_OPTIONS,
    "binary_two_stage": _QUANTISER_OPTIONS + ("rerank", "rerank_factor"),
    "binary_ivf": _QUANTISER_OPTIONS + ("nlist", "nprobe", "codes"),
    "pq": _PQ_OPTIONS,
    "opq": _PQ_OPTIONS,
    "binary_opq": _PQ_OPTIONS + _QUANTISER_OPTIONS,
}
