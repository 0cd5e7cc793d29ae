"""Locations relative to a storage root (``orchestrator.storage.locations``): local folders and
object-store prefixes, locations outside the root kept absolute, escapes refused."""
from __future__ import annotations

import os

import pytest

from orchestrator.storage.locations import RELATIVE_PREFIX, StorageRoot


def test_a_local_location_under_the_root_is_recorded_relative_and_resolves_under_another_root(tmp_path):
    old, new = StorageRoot(str(tmp_path / "run")), StorageRoot(str(tmp_path / "moved"))
    location = str(tmp_path / "run" / "generations" / "g0" / "card.json")
    recorded = old.relative(location)
    assert recorded == "storage:generations/g0/card.json"
    assert old.resolve(recorded) == location
    assert new.resolve(recorded) == os.path.join(str(tmp_path), "moved", "generations", "g0", "card.json")


def test_the_root_is_normalised_file_uris_trailing_slashes_and_relative_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = StorageRoot("run/")
    assert root.uri == str(tmp_path / "run")
    assert StorageRoot(f"file://{tmp_path}/run").uri == str(tmp_path / "run")
    assert root.relative(f"file://{tmp_path}/run/reports/x.csv") == "storage:reports/x.csv"
    assert root.relative(str(tmp_path / "run")) == RELATIVE_PREFIX
    assert root.resolve(RELATIVE_PREFIX) == str(tmp_path / "run")


def test_an_object_store_prefix_moves_to_another_bucket():
    old, new = StorageRoot("s3://bucket-a/runs/one/"), StorageRoot("s3://bucket-b/copy")
    recorded = old.relative("s3://bucket-a/runs/one/galleries/g/shard-00000.faiss")
    assert recorded == "storage:galleries/g/shard-00000.faiss"
    assert new.resolve(recorded) == "s3://bucket-b/copy/galleries/g/shard-00000.faiss"


@pytest.mark.parametrize("location", [
    "/elsewhere/generations/g0",          # another folder
    "/data/run-other/generations/g0",     # a sibling whose name starts like the root
    "s3://bucket-a/runs/one/x",           # another file system
    "g0-old",                             # not a location at all
    "data/digits",                        # a relative path (the working directory's)
    "/data/run/a/../b",                   # under the root only before normalising: kept as written
])
def test_what_is_not_a_plain_path_below_the_root_stays_as_it_is(location):
    assert StorageRoot("/data/run").relative(location) == location
    assert StorageRoot("/data/run").resolve(location) == location


@pytest.mark.parametrize("recorded", ["storage:../other/x", "storage:/etc/passwd", "storage:a/../../x",
                                      "storage:s3://bucket/x", "storage:a/./b"])
def test_a_recorded_location_that_would_leave_the_root_is_refused(recorded):
    with pytest.raises(ValueError, match="would leave the storage root /data/run"):
        StorageRoot("/data/run").resolve(recorded)


def test_json_values_and_step_keys_are_translated_both_ways():
    old, new = StorageRoot("/data/run"), StorageRoot("/mnt/copy")
    outputs = {"plan_uri": "/data/run/galleries/g/plans/g0.json", "entries": 3, "generation": "g0",
               "shards": [{"embeddings_uri": "/data/run/galleries/g/shard-0.parquet", "sha256": "ab"}],
               "source": "/data/images"}
    recorded = old.relative_json(outputs)
    assert recorded == {"plan_uri": "storage:galleries/g/plans/g0.json", "entries": 3, "generation": "g0",
                        "shards": [{"embeddings_uri": "storage:galleries/g/shard-0.parquet", "sha256": "ab"}],
                        "source": "/data/images"}
    assert new.resolve_json(recorded)["shards"][0]["embeddings_uri"] == "/mnt/copy/galleries/g/shard-0.parquet"
