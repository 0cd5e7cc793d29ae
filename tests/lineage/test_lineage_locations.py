"""The lineage records locations under the storage root relative to it (``lineage/locations.py``):
the rows hold ``storage:<path>``, every record comes back absolute under the root the store is
given, a moved storage resolves to its new place, and a lineage written with absolute locations
keeps working."""
from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from alembic import command
from sqlalchemy import create_engine

from orchestrator.lineage import LineageStore, migrate
from orchestrator.lineage.records import ShardAssignment
from orchestrator.lineage.step_keys import StepKind, integrity_key, shard_update_key


def raw(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as connection:
        return connection.execute(sql).fetchall()


def record_a_run(store: LineageStore, root: Path) -> None:
    """A generation, a two-shard gallery, an index hash step, an evaluation and a deployment, with
    locations under ``root`` and one outside it."""
    store.upsert_generation("g0", method="independent")
    store.mark_generation_trained("g0", str(root / "generations" / "g0"), "a" * 64, step="train:g0",
                                  step_outputs={"checkpoint_uri": str(root / "generations" / "g0"), "sha256": "a" * 64})
    store.upsert_gallery("gal", "/datasets/digits", 100, 2)
    for index in range(2):
        shard = root / "galleries" / "gal" / f"shard-{index}"
        store.commit_step(integrity_key(f"{shard}.faiss"), {"sha256": str(index)})
        store.assign_shard("gal", index, "g0", f"{shard}.parquet", f"{shard}.faiss", "d" * 64, 50,
                           step=shard_update_key(StepKind.EMBED, "gal", index, "g0"))
    store.record_compatibility([("g0", "g0", "map", 0.5, "digits")], step="evaluate:g0",
                               step_outputs={"embeddings": {"uri": str(root / "generations" / "g0" / "eval.safetensors")}})
    store.deploy("g0", step="deploy:g0", step_outputs={"shards": [{"embeddings_uri": s.embeddings_uri}
                                                                  for s in store.shards("gal")]})


def test_rows_hold_relative_locations_and_records_absolute_ones(tmp_path):
    root = tmp_path / "run"
    store = LineageStore(root / "lineage.db", storage=root)
    record_a_run(store, root)
    db = root / "lineage.db"
    assert raw(db, "SELECT checkpoint_uri FROM generations") == [("storage:generations/g0",)]
    assert raw(db, "SELECT embeddings_uri, index_uri FROM shards ORDER BY \"index\"") == [
        (f"storage:galleries/gal/shard-{i}.parquet", f"storage:galleries/gal/shard-{i}.faiss") for i in range(2)]
    assert raw(db, "SELECT source_uri FROM galleries") == [("/datasets/digits",)]  # outside the root: absolute
    keys = [key for (key,) in raw(db, "SELECT key FROM steps")]
    assert "integrity:storage:galleries/gal/shard-0.faiss" in keys and not any(str(root) in key for key in keys)
    assert not any(str(root) in outputs for (outputs,) in raw(db, "SELECT outputs FROM steps"))
    assert raw(db, "SELECT name, value FROM settings") == [("storage_root", str(root))]

    assert store.get_generation("g0").checkpoint_uri == str(root / "generations" / "g0")
    assert [s.index_uri for s in store.shards("gal")] == [str(root / "galleries" / "gal" / f"shard-{i}.faiss")
                                                          for i in range(2)]
    assert store.committed_outputs(integrity_key(f"{root}/galleries/gal/shard-1.faiss")) == {"sha256": "1"}
    assert integrity_key(f"{root}/galleries/gal/shard-0.faiss") in [s.key for s in store.steps(StepKind.INTEGRITY.prefix)]
    assert store.committed_outputs("evaluate:g0")["embeddings"]["uri"] == str(root / "generations" / "g0" / "eval.safetensors")


def test_a_moved_storage_resolves_to_its_new_place_and_keeps_its_rows(tmp_path):
    old, new = tmp_path / "run", tmp_path / "elsewhere" / "moved"
    store = LineageStore(old / "lineage.db", storage=old)
    record_a_run(store, old)
    counts = store.row_counts()
    store.close()
    new.parent.mkdir()
    shutil.move(str(old), str(new))

    moved = LineageStore(new / "lineage.db", storage=new)
    assert moved.get_generation("g0").checkpoint_uri == str(new / "generations" / "g0")
    assert moved.committed_outputs("deploy:g0")["shards"][0]["embeddings_uri"] == str(new / "galleries" / "gal" / "shard-0.parquet")
    assert moved.committed_outputs(integrity_key(f"{new}/galleries/gal/shard-0.faiss")) == {"sha256": "0"}
    assert moved.committed_outputs(integrity_key(f"{old}/galleries/gal/shard-0.faiss")) is None  # nothing points back
    # the same writes again (a resumed run at the new place) change no row
    record_a_run(moved, new)
    assert moved.row_counts() == counts
    # a rollback restores the shards at the new place too
    restored = [ShardAssignment(s.index, "g0", s.embeddings_uri, s.index_uri, s.sha256, s.n_items)
                for s in moved.shards("gal")]
    moved.deploy("g0", restore=("gal", restored))
    assert raw(new / "lineage.db", "SELECT index_uri FROM shards ORDER BY \"index\"")[0] == ("storage:galleries/gal/shard-0.faiss",)
    # a reader that knows only the lineage resolves against the root the last writer was given
    assert LineageStore(new / "lineage.db", readonly=True).get_generation("g0").checkpoint_uri == str(new / "generations" / "g0")


def test_a_copied_prefix_resolves_into_the_other_bucket(tmp_path):
    store = LineageStore(tmp_path / "lineage.db", storage="s3://bucket-a/runs/one")
    store.upsert_generation("g0")
    store.mark_generation_trained("g0", "s3://bucket-a/runs/one/generations/g0", "a" * 64)
    store.close()
    copy = LineageStore(tmp_path / "lineage.db", storage="s3://bucket-b/copy", readonly=True)
    assert copy.get_generation("g0").checkpoint_uri == "s3://bucket-b/copy/generations/g0"


def test_a_recorded_location_that_leaves_the_root_is_refused(tmp_path):
    store = LineageStore(tmp_path / "lineage.db", storage=tmp_path / "run")
    with sqlite3.connect(tmp_path / "lineage.db") as connection:  # a tampered lineage
        connection.execute("INSERT INTO steps (key, status, attempts, outputs, started_at) VALUES ('report:x', "
                           "'committed', 1, '{\"uri\": \"storage:../../etc/passwd\"}', '2026-01-01')")
    with pytest.raises(ValueError, match="recorded location 'storage:../../etc/passwd' would leave the storage root"):
        store.get_step("report:x")


def test_a_lineage_with_absolute_locations_keeps_working(tmp_path):
    """Rows written before locations were relative (at revision 0002, absolute everywhere) are read as
    they are; a step is found under its absolute key, and written again it takes the relative one."""
    root, db = tmp_path / "run", tmp_path / "run" / "lineage.db"
    root.mkdir()
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as connection:
        command.upgrade(migrate._config(connection), "0002")
    engine.dispose()
    index = f"{root}/galleries/gal/shard-0.faiss"
    with sqlite3.connect(db) as connection:
        connection.execute("INSERT INTO generations (name, params, checkpoint_uri, sha256, status, metrics, created_at, "
                           "updated_at) VALUES ('g0', '{}', ?, 'ab', 'trained', '{}', '2026-01-01', '2026-01-01')",
                           (f"{root}/generations/g0",))
        connection.execute("INSERT INTO steps (key, status, attempts, outputs, started_at) VALUES (?, 'committed', 1, "
                           "?, '2026-01-01')", (integrity_key(index), '{"sha256": "1"}'))

    store = LineageStore(db, storage=root)  # migrates to the head
    assert store.get_generation("g0").checkpoint_uri == f"{root}/generations/g0"
    assert store.step_status(integrity_key(index)) == "committed"
    assert store.start_step(integrity_key(index)).attempts == 1  # committed: found, not started again
    store.commit_step(integrity_key(index), {"sha256": "2"})
    assert raw(db, "SELECT key, outputs FROM steps") == [("integrity:storage:galleries/gal/shard-0.faiss", '{"sha256": "2"}')]
    assert store.committed_outputs(integrity_key(index)) == {"sha256": "2"}


def test_a_prefix_copied_to_another_bucket_serves_from_the_copy(s3_bucket, monkeypatch, tmp_path):
    """A generation and a two-shard gallery written under ``s3://<bucket>/runs/a`` as the pipeline
    writes them; the prefix is copied to another bucket and the original deleted: the router opened
    on the copied lineage with the new prefix serves the same (brute-force checked) results."""
    import boto3
    import s3fs

    from orchestrator.gallery import ShardEmbeddings
    from orchestrator.integrity import index_steps, trained_outputs
    from orchestrator.methods import create_method
    from orchestrator.models.checkpoint import save_generation
    from orchestrator.models.encoder import EncoderConfig
    from orchestrator.search.service import open_router
    from orchestrator.shard_update import ShardTarget, write_shard_files
    from orchestrator.storage import join_uri

    bucket, endpoint = s3_bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    other = f"{bucket}-copy"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=other)
    source, target = f"s3://{bucket}/runs/a", f"s3://{other}/copies/b"
    store = LineageStore(tmp_path / "a.db", storage=source)
    method = create_method("independent", {})
    model = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=4), 10, range(10))
    checkpoint = join_uri(source, "generations", "g0")
    card = save_generation(model, method, None, checkpoint, name="g0")
    store.upsert_generation("g0", method="independent")
    store.mark_generation_trained("g0", checkpoint, card.sha256, step="train:g0",
                                  step_outputs=trained_outputs(checkpoint, card.sha256))
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(10, 4)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store.upsert_gallery("tiny", "memory", 10, 2)
    for index, ids in enumerate((np.arange(6), np.arange(6, 10))):
        shard = ShardEmbeddings(ids, ids % 3, vectors[ids], np.zeros(len(ids), np.float32), "g0", "cosine", 1.0)
        written = write_shard_files(index, shard, ShardTarget(join_uri(source, "galleries", "tiny")), "test", True)
        store.assign_shard("tiny", index, "g0", written.embeddings_uri, written.index_uri, written.sha256, len(shard),
                           with_steps=index_steps([(written.index_uri, written.index_record)]))
    queries = rng.normal(size=(3, 4)).astype(np.float32)
    before = open_router(store, "tiny", "g0").search(queries, 4)
    store.close()

    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    fs.copy(f"{bucket}/runs/a", f"{other}/copies/b", recursive=True)
    fs.rm(f"{bucket}/runs", recursive=True)
    assert not fs.find(bucket)
    shutil.copy(tmp_path / "a.db", tmp_path / "b.db")
    copy = LineageStore(tmp_path / "b.db", storage=target, readonly=True)
    assert copy.get_generation("g0").checkpoint_uri == f"{target}/generations/g0"
    after = open_router(copy, "tiny", "g0").search(queries, 4)

    unit = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    expected = np.argsort(-(unit @ vectors.T), axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(after.ids, expected)
    np.testing.assert_array_equal(after.ids, before.ids)
    np.testing.assert_allclose(after.distances, before.distances)
