"""Every kind by name: build_index dispatch, load_index / index_from_bytes round trips, corrupt data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrator.geometry import lorentz
from orchestrator.index import (
    ALL_KINDS,
    OPTIONS,
    BinaryIndex,
    PQIndex,
    ShardIndex,
    build_index,
    index_from_bytes,
    load_index,
)

CURV = 0.5
# small options so that every kind builds quickly on 400 points
SMALL = {"ivf": {"nlist": 8}, "binary_ivf": {"nlist": 8}, "pq": {"pq_nbits": 6}, "opq": {"pq_nbits": 6},
         "binary_opq": {"pq_nbits": 6}, "binary_two_stage": {"rerank": "float", "rerank_factor": 3}}
CLASS_OF = {"flat": ShardIndex, "ivf": ShardIndex, "hnsw": ShardIndex, "binary": BinaryIndex,
            "binary_weighted": BinaryIndex, "binary_two_stage": BinaryIndex, "binary_ivf": BinaryIndex,
            "pq": PQIndex, "opq": PQIndex, "binary_opq": PQIndex}


def _lorentz_points(n: int, seed: int) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    return lorentz.expmap0(0.6 * torch.randn(n, 8, generator=gen, dtype=torch.float64), CURV).numpy()


def test_kind_names():
    assert ALL_KINDS == ("flat", "ivf", "hnsw", "binary", "binary_weighted", "binary_two_stage", "binary_ivf",
                         "pq", "opq", "binary_opq")
    assert set(OPTIONS) == set(ALL_KINDS) == set(CLASS_OF)


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("space", ["lorentz", "euclidean"])
def test_round_trip_every_kind(tmp_path, kind, space):
    gallery, queries = _lorentz_points(400, seed=1), _lorentz_points(15, seed=2)
    ids = np.arange(400) * 5 + 3
    index = build_index(gallery, space, kind, ids=ids, curv=CURV, **SMALL.get(kind, {}))
    assert type(index) is CLASS_OF[kind] and index.kind == kind and index.ntotal == 400
    uri = str(tmp_path / f"{kind}.idx")
    index.save(uri)
    loaded = load_index(uri)
    assert type(loaded) is type(index) and loaded.header() == index.header()
    from_bytes = index_from_bytes(index.to_bytes())
    for restored in (loaded, from_bytes):
        for before, after in zip(index.search(queries, 7), restored.search(queries, 7)):
            np.testing.assert_array_equal(before, after)
    _, found = loaded.search(queries, 7)
    assert np.isin(found, ids).all()
    if isinstance(index, ShardIndex):  # the float kinds still load through their own class
        assert ShardIndex.load(uri).kind == kind
    else:
        assert type(index).load(uri).kind == kind
        assert loaded.memory_bytes == index.memory_bytes and loaded.code_bytes == index.code_bytes


def test_corrupt_or_foreign_bytes_are_rejected(tmp_path):
    gallery = _lorentz_points(300, seed=3)
    data = build_index(gallery, "lorentz", "binary_weighted", curv=CURV).to_bytes()
    pq_data = build_index(gallery, "lorentz", "pq", curv=CURV, pq_nbits=6).to_bytes()
    with pytest.raises(ValueError, match="bad magic"):
        index_from_bytes(b"definitely not an index")
    with pytest.raises(ValueError, match="checksum"):
        index_from_bytes(data[:-10])
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF
    with pytest.raises(ValueError, match="checksum"):
        index_from_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="trailing bytes"):
        index_from_bytes(data + b"xx")
    with pytest.raises(ValueError, match="bad magic"):
        ShardIndex.from_bytes(data)
    with pytest.raises(ValueError, match="kind must be one of .* for BinaryIndex, got 'pq'"):
        BinaryIndex.from_bytes(pq_data)
    (tmp_path / "bad.idx").write_bytes(data[:20])
    with pytest.raises(ValueError, match="bad.idx"):
        load_index(str(tmp_path / "bad.idx"))
    with pytest.raises(FileNotFoundError):
        load_index(str(tmp_path / "missing.idx"))


def test_build_index_errors():
    gallery = _lorentz_points(50, seed=4)
    with pytest.raises(ValueError, match="kind must be one of"):
        build_index(gallery, "lorentz", "lsh")
    with pytest.raises(ValueError, match="option 'bits' does not apply to kind='flat'"):
        build_index(gallery, "lorentz", "flat", bits=2)
    with pytest.raises(ValueError, match="space must be one of"):
        build_index(gallery, "spherical", "binary")
    with pytest.raises(ValueError, match="lorentz embeddings must be"):
        build_index(gallery[:, :1], "lorentz", "binary")
