"""Every index kind by name: ``build_index`` dispatches on ``kind``, ``load_index`` on the magic bytes.

=========================== ===================== ===============================================
kinds                       class                 module
=========================== ===================== ===============================================
``flat``, ``ivf``, ``hnsw`` ``ShardIndex``        ``shard_index`` (float, exact space distances)
``binary``,                 ``BinaryIndex``       ``binary_index`` (bit-plane codes, Hamming)
``binary_weighted``,
``binary_two_stage``,
``binary_ivf``
``pq``, ``opq``,            ``PQIndex``           ``pq_index`` (product quantisation)
``binary_opq``
=========================== ===================== ===============================================

All three are a ``protocol.StoredIndex``: ``search(queries, k) -> (distances (Q, k) float64, ids (Q, k)
int64)``, ``ntotal``, ``kind``, ``dim``, ``to_bytes`` / ``save`` and a ``header()`` (and each class its
``from_bytes`` / ``load``). The options each kind accepts
are in ``OPTIONS``; any other option is a ValueError naming it.
"""

from __future__ import annotations

from typing import Any, Mapping

from orchestrator.geometry.spaces import Space
from orchestrator.index import container, shard_index
from orchestrator.index.binary_index import BinaryIndex, build_binary_index
from orchestrator.index.kinds import ALL_KINDS, BINARY_KINDS, OPTIONS, PQ_KINDS, SHARD_KINDS
from orchestrator.index.pq_index import PQIndex, build_pq_index
from orchestrator.index.protocol import StoredIndex
from orchestrator.index.shard_index import ShardIndex
from orchestrator.storage.filesystem import read_bytes, redact_uri


def build_index(embeddings: Any, space: Space | str, kind: str = "flat", ids: Any = None, *, curv: float = 1.0,
                **options: Any) -> StoredIndex:
    """Build the index of ``kind`` over ``embeddings (N, D)`` of ``space``; ``ids (N,)`` item ids
    (default ``0..N-1``), ``curv`` the hyperbolic curvature; ``options`` as ``OPTIONS[kind]`` (see
    ``shard_index.build_index``, ``build_binary_index``, ``build_pq_index`` for their meaning)."""
    if kind not in ALL_KINDS:
        raise ValueError(f"kind must be one of {list(ALL_KINDS)}, got {kind!r}")
    unknown = sorted(set(options) - set(OPTIONS[kind]))
    if unknown:
        raise ValueError(f"option {unknown[0]!r} does not apply to kind={kind!r} (got {unknown[0]}="
                         f"{options[unknown[0]]!r}); its options are {list(OPTIONS[kind])}")
    if kind in SHARD_KINDS:
        return shard_index.build_index(embeddings, space, kind, ids, curv=curv, **options)
    if kind in BINARY_KINDS:
        return build_binary_index(embeddings, space, kind, ids, curv=curv, **options)
    return build_pq_index(embeddings, space, kind, ids, curv=curv, **options)


def index_from_bytes(data: bytes, whole_file_checked: bool = False) -> StoredIndex:
    """The index serialised in ``data`` (any kind): dispatch on the magic bytes, then on ``kind``.
    ``whole_file_checked``: ``ShardIndex.from_bytes``'s (the compressed kinds check their sections
    either way)."""
    data = bytes(data)
    if data.startswith(shard_index.MAGIC):
        return ShardIndex.from_bytes(data, whole_file_checked)
    if not data.startswith(container.MAGIC):
        raise ValueError("data is not a serialised index (bad magic bytes)")
    header, sections = container.unpack(data)
    if header.get("kind") in BINARY_KINDS:
        return BinaryIndex.from_parts(header, sections)
    if header.get("kind") in PQ_KINDS:
        return PQIndex.from_parts(header, sections)
    raise ValueError(f"kind must be one of {list(BINARY_KINDS + PQ_KINDS)} in a compressed index, got {header.get('kind')!r}")


def load_index(uri: str, storage_options: Mapping[str, Any] | None = None) -> StoredIndex:
    """Read an index of any kind written by its ``save``; FileNotFoundError if absent, ValueError if corrupt."""
    data = read_bytes(uri, storage_options)
    try:
        return index_from_bytes(data)
    except ValueError as exc:
        raise ValueError(f"{redact_uri(uri)}: {exc}") from None
