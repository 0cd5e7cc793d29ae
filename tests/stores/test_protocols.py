"""The seams' protocols hold what their implementations do: every index kind is a ``StoredIndex``,
every store class a ``GalleryStore`` (the row stores a ``RowStore``) with the protocol's signatures,
and the shards the row stores open search as an index does."""
import inspect

import numpy as np
import pytest

from orchestrator.index import ALL_KINDS, build_index, index_from_bytes
from orchestrator.index.protocol import ShardSearch, StoredIndex
from orchestrator.stores.files import ShardFileStore
from orchestrator.stores.lance import LanceShard, LanceStore
from orchestrator.stores.pgvector import PgVectorShard, PgVectorStore
from orchestrator.stores.protocol import GalleryStore, RowStore
from protocol_checks import accepts, protocol_methods


@pytest.mark.parametrize("store, protocols", [
    (ShardFileStore, [GalleryStore]),
    (LanceStore, [GalleryStore, RowStore]),
    (PgVectorStore, [GalleryStore, RowStore]),
])
def test_every_store_has_each_protocol_method_as_declared(store, protocols):
    for protocol in protocols:
        for name, declared in protocol_methods(protocol).items():
            assert accepts(inspect.signature(getattr(store, name)), declared), (store.__name__, name)
    assert isinstance(getattr(store, "kind", None), str)


def test_a_protocol_method_of_another_signature_is_told():
    class Narrower:
        def open_shard(self, uri):
            pass

    declared = protocol_methods(GalleryStore)["open_shard"]
    assert not accepts(inspect.signature(Narrower.open_shard), declared)


@pytest.mark.parametrize("shard", [LanceShard, PgVectorShard])
def test_the_shards_a_row_store_opens_search_as_an_index(shard):
    assert accepts(inspect.signature(shard.search), protocol_methods(ShardSearch)["search"])
    assert isinstance(inspect.getattr_static(shard, "ntotal"), property)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_every_index_kind_is_a_stored_index(kind):
    rng = np.random.default_rng(0)
    embeddings = rng.standard_normal((300, 8)).astype(np.float32)
    options = {"nlist": 2} if "ivf" in kind else {}
    index = build_index(embeddings, "euclidean" if kind not in ("binary", "binary_weighted", "binary_two_stage",
                                                                 "binary_ivf", "binary_opq") else "lorentz",
                        kind, np.arange(100, 400), **options)
    assert isinstance(index, StoredIndex) and isinstance(index, ShardSearch)
    again = index_from_bytes(index.to_bytes())
    assert isinstance(again, StoredIndex) and (again.kind, again.dim, again.ntotal) == (kind, index.dim, 300)
