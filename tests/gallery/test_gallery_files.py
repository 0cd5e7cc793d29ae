"""Shard layout and shard files: contiguous id blocks, Parquet round trips with checksums, and
content-named files."""
import numpy as np
import pytest

from orchestrator.gallery import (
    ShardEmbeddings,
    home_shards,
    read_recorded_attributes,
    read_recorded_shard,
    read_shard,
    shard_file_uris,
    shard_members,
    write_shard,
)
from orchestrator.gallery.shard_files import item_set_version
from orchestrator.storage import ChecksumMismatch, write_bytes_atomic


def shard(n=7, width=5, generation="g0", seed=0, start=100):
    rng = np.random.default_rng(seed)
    return ShardEmbeddings(np.arange(start, start + n), rng.integers(0, 3, n), rng.normal(size=(n, width)).astype(np.float32),
                           rng.random(n).astype(np.float32), generation, "lorentz", 0.5)


def test_home_shards_are_contiguous_id_blocks_whatever_the_listing_order():
    ids = np.random.default_rng(0).permutation(np.arange(10, 33))  # 23 ids, shuffled
    shard_of = home_shards(ids, 4)
    sizes = np.bincount(shard_of)
    assert sizes.tolist() == [6, 6, 6, 5]
    members = shard_members(ids, 4)
    assert [m.tolist() for m in members] == [list(range(10, 16)), list(range(16, 22)), list(range(22, 28)),
                                             list(range(28, 33))]
    assert np.array_equal(home_shards(np.sort(ids), 4), np.sort(shard_of))
    with pytest.raises(ValueError, match="unique"):
        home_shards(np.array([1, 1, 2]), 2)
    with pytest.raises(ValueError, match="3 items cannot fill 4 shards"):
        home_shards(np.array([1, 2, 3]), 4)


def test_shard_round_trip_with_checksum(tmp_path):
    original = shard()
    uri = str(tmp_path / "s.parquet")
    digest = write_shard(uri, original)
    loaded = read_shard(uri, expected_sha256=digest)
    for field in ("ids", "labels", "embeddings", "uncertainty"):
        np.testing.assert_array_equal(getattr(loaded, field), getattr(original, field))
    assert (loaded.generation, loaded.space, loaded.curv) == ("g0", "lorentz", 0.5)
    data = bytearray((tmp_path / "s.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    write_bytes_atomic(uri, bytes(data))
    with pytest.raises(ChecksumMismatch, match="s.parquet"):
        read_shard(uri, expected_sha256=digest)


def test_a_recorded_shard_is_read_only_as_the_lineage_recorded_it(tmp_path):
    from datetime import datetime

    from orchestrator.lineage.records import ShardRecord
    from orchestrator.pipeline.gallery.plan import ShardBefore

    uri = str(tmp_path / "s.parquet")
    digest = write_shard(uri, shard())
    row = ShardRecord("gal", 0, 7, "g0", uri, str(tmp_path / "s.faiss"), digest, datetime(2026, 1, 1))
    before = ShardBefore(0, "g0", uri, digest, 7)
    assert read_recorded_shard(row).ids.tolist() == read_recorded_shard(before).ids.tolist() == list(range(100, 107))
    write_shard(uri, shard(seed=1))  # another file under the recorded name
    for record in (row, before):
        with pytest.raises(ChecksumMismatch, match=f"checksum mismatch for {uri}: expected sha256 {digest}"):
            read_recorded_shard(record)


def test_a_recorded_shards_attributes_are_its_files_checked_without_the_embeddings(tmp_path):
    import dataclasses
    from types import SimpleNamespace

    import pyarrow as pa

    uri = str(tmp_path / "s.parquet")
    ids = np.array([105, 100, 103, 101, 104, 102, 106])  # stored in this order
    attributes = pa.table({"uri": [f"s3://b/{i}.png" for i in ids], "size": (ids * 3).tolist()})
    with_attributes = dataclasses.replace(shard(), ids=ids, attributes=attributes)
    record = SimpleNamespace(embeddings_uri=uri, sha256=write_shard(uri, with_attributes))
    read_ids, read_attributes = read_recorded_attributes(record)
    whole = read_recorded_shard(record)
    assert read_ids.dtype == np.int64 and read_ids.tolist() == whole.ids.tolist() == ids.tolist()
    assert read_attributes.to_pylist() == whole.attributes.to_pylist() == attributes.to_pylist()
    plain = SimpleNamespace(embeddings_uri=uri, sha256=write_shard(uri, shard()))
    assert read_recorded_attributes(plain)[1] is None  # no attribute columns recorded
    with pytest.raises(ChecksumMismatch, match=f"checksum mismatch for {uri}"):
        read_recorded_attributes(record)  # the file under the name is not the recorded one any more


def test_without_and_names_by_content():
    s = shard(n=6)
    rest = s.without(np.array([101, 104]))
    assert rest.ids.tolist() == [100, 102, 103, 105]
    np.testing.assert_array_equal(rest.embeddings, s.embeddings[[0, 2, 3, 5]])
    a = shard_file_uris("/g", 3, "g1", np.array([5, 2, 9]))
    assert a == shard_file_uris("/g", 3, "g1", np.array([9, 5, 2]))  # order-free
    assert a[0] == f"/g/shard-00003/g1.{item_set_version(np.array([2, 5, 9]))}.parquet" and a[1].endswith(".index")
    assert shard_file_uris("/g", 3, "g1", np.array([5, 2]))[0] != a[0]
    with pytest.raises(ValueError, match="unique"):
        ShardEmbeddings(np.array([1, 1]), np.zeros(2, int), np.zeros((2, 3), np.float32), np.zeros(2, np.float32),
                        "g", "cosine", 1.0)
