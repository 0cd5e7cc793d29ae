"""Stored files against the lineage's hashes, without Ray: a tiny gallery of two shards written
here (Parquet, flat index, lineage rows and index hashes as the gallery steps write them), then
tampered with: every change is refused by the checked loader and reported by ``verify``; a run
refuses to overwrite files the lineage does not know, and checks a checkpoint before reusing it."""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from orchestrator.config import load_pipeline
from orchestrator.gallery import ShardEmbeddings
from orchestrator.geometry.spaces import Space
from orchestrator.index import load_index
from orchestrator.integrity import IntegrityError, ids_sha256, index_steps, load_checked_index, trained_outputs
from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import integrity_key, plan_key
from orchestrator.methods import create_method
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.pipeline.runner import PipelineRunner
from orchestrator.pipeline.verify import (
    UnknownArtefact,
    adopt_unhashed,
    refuse_unknown_file,
    refuse_unknown_storage,
    verify_storage,
)
from orchestrator.search import SearchRouter
from orchestrator.shard_update import ShardTarget, write_shard_files

GALLERY = "tiny"


def _shard(ids: np.ndarray, seed: int) -> ShardEmbeddings:
    rng = np.random.default_rng(seed)
    return ShardEmbeddings(ids.astype(np.int64), ids % 3, rng.normal(size=(len(ids), 4)).astype(np.float32),
                           np.zeros(len(ids), np.float32), "g0", "euclidean", 1.0)


@pytest.fixture
def gallery(tmp_path: Path):
    """(storage root, store, shard rows) of a gallery of 2 shards (ids 0..5 and 6..9) embedded by g0."""
    storage = tmp_path / "storage"
    store = LineageStore.under(tmp_path)
    store.upsert_generation("g0")
    store.upsert_gallery(GALLERY, "memory", 10, 2)
    for index, ids in enumerate((np.arange(6), np.arange(6, 10))):
        shard = _shard(ids, index)
        written = write_shard_files(index, shard, ShardTarget(str(storage / "galleries" / GALLERY)), "test", True)
        store.assign_shard(GALLERY, index, "g0", written.embeddings_uri, written.index_uri, written.sha256, len(shard),
                           with_steps=index_steps([(written.index_uri, written.index_record)]))
    yield storage, store, store.shards(GALLERY)
    store.close()


def _flip_last_byte(path: str) -> None:
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 0xFF
    Path(path).write_bytes(bytes(data))


def test_an_intact_gallery_loads_and_verifies(gallery):
    storage, store, shards = gallery
    index = load_checked_index(store, shards[0])
    assert index.ntotal == 6
    result = verify_storage(store, str(storage))
    assert result.ok and result.checked == 2 and result.unreferenced == []
    record = store.committed_outputs(integrity_key(shards[1].index_uri))
    assert record["ids_sha256"] == hashlib.sha256(np.arange(6, 10, dtype="<i8").tobytes()).hexdigest()
    assert record["sha256"] == hashlib.sha256(Path(shards[1].index_uri).read_bytes()).hexdigest()


def test_ids_hash_ignores_order():
    assert ids_sha256([3, 1, 2]) == ids_sha256(np.array([1, 2, 3]))
    assert ids_sha256([1, 2, 3]) != ids_sha256([1, 2, 4])


def test_a_changed_index_header_is_refused(gallery):
    storage, store, shards = gallery
    path = Path(shards[0].index_uri)
    data = path.read_bytes()
    magic, (length,) = data[:8], struct.unpack("<I", data[8:12])
    header = json.loads(data[12:12 + length])
    assert "curv" in header
    header["curv"] = 2.0  # the unchanged index payload would still load: only the lineage's hash catches it
    raw = json.dumps(header, sort_keys=True).encode()
    path.write_bytes(magic + struct.pack("<I", len(raw)) + raw + data[12 + length:])
    assert load_index(str(path)).ntotal == 6  # the file itself still looks intact
    with pytest.raises(IntegrityError, match="index file changed"):
        load_checked_index(store, shards[0])
    result = verify_storage(store, str(storage))
    assert not result.ok and "shard 0" in result.problems[0]


def test_a_changed_index_payload_is_refused(gallery):
    storage, store, shards = gallery
    _flip_last_byte(shards[1].index_uri)
    with pytest.raises(IntegrityError, match=r"sha256 [0-9a-f]{64}, the lineage holds"):
        load_checked_index(store, shards[1])
    assert not verify_storage(store, str(storage)).ok


def test_an_index_swapped_between_shards_is_refused_by_the_loader_and_the_router(gallery):
    storage, store, shards = gallery
    Path(shards[0].index_uri).write_bytes(Path(shards[1].index_uri).read_bytes())
    with pytest.raises(IntegrityError, match="index file changed"):
        load_checked_index(store, shards[0])
    # even with an unchecked loader, the router refuses an index not holding the lineage's items
    model = SimpleNamespace(space=Space.EUCLIDEAN, curv=1.0)
    with pytest.raises(ValueError, match="holds 4 items, the lineage's shard 6; refusing to serve it"):
        SearchRouter("g0", {"g0": model}, {"g0": None}, shards, None, load_index)
    result = verify_storage(store, str(storage))
    assert [p.split(":")[0] for p in result.problems] == [f"gallery {GALLERY} shard 0"]


def test_a_changed_shard_file_and_a_missing_one_are_reported(gallery):
    storage, store, shards = gallery
    _flip_last_byte(shards[0].embeddings_uri)
    Path(shards[1].embeddings_uri).unlink()
    result = verify_storage(store, str(storage))
    assert len(result.problems) == 2
    assert "checksum mismatch" in result.problems[0] and "missing (orphan)" in result.problems[1]


def test_unreferenced_files_are_listed_but_not_errors(gallery):
    storage, store, _shards = gallery
    stray = storage / "galleries" / GALLERY / "shard-00000" / "g9.stray.parquet"
    stray.write_bytes(b"x")
    result = verify_storage(store, str(storage))
    assert result.ok and result.unreferenced == [str(stray)]


def test_a_file_unknown_to_the_lineage_is_not_overwritten(gallery, tmp_path):
    storage, store, shards = gallery
    target = storage / "generations" / "g1" / "card.json"
    target.parent.mkdir(parents=True)
    target.write_text("{}")
    store.start_step("train:g1")
    with pytest.raises(UnknownArtefact, match="train:g1: .*card.json exists but the lineage does not know it"):
        refuse_unknown_file(store, "train:g1", str(target))
    store.start_step("train:g1")  # a second attempt: the first one may have written it
    refuse_unknown_file(store, "train:g1", str(target))


def test_an_empty_lineage_next_to_stored_artefacts_is_refused(gallery, tmp_path):
    storage, store, _shards = gallery
    empty = LineageStore.under(tmp_path / "elsewhere")
    with pytest.raises(UnknownArtefact, match="is empty but storage .* holds 4 artefact file"):
        refuse_unknown_storage(empty, str(storage), "sqlite:///lost.db")
    refuse_unknown_storage(empty, str(tmp_path / "fresh"), "sqlite:///lost.db")  # nothing stored: fine
    refuse_unknown_storage(store, str(storage), "sqlite:///kept.db")  # the lineage knows g0: fine
    empty.close()


def test_a_changed_plan_file_is_reported(gallery):
    storage, store, _shards = gallery
    plan = storage / "galleries" / GALLERY / "plans" / "g0.json"
    plan.parent.mkdir()
    plan.write_text('{"entries": []}')
    store.commit_step(plan_key(GALLERY, "g0"), {"plan_uri": str(plan), "sha256": hashlib.sha256(plan.read_bytes()).hexdigest()})
    assert verify_storage(store, str(storage)).ok
    plan.write_text('{"entries": [1]}')
    result = verify_storage(store, str(storage))
    assert len(result.problems) == 1 and result.problems[0].startswith(
        f"plan plan:{GALLERY}:g0: {plan}: plan file changed since it was written: sha256")


def test_adopt_records_the_index_hashes_an_older_lineage_lacks(gallery):
    storage, store, shards = gallery
    older = LineageStore.under(storage.parent / "older")
    older.upsert_generation("g0")
    older.upsert_gallery(GALLERY, "memory", 10, 2)
    for shard in shards:
        older.assign_shard(GALLERY, shard.index, "g0", shard.embeddings_uri, shard.index_uri, shard.sha256, shard.n_items)
    with pytest.raises(IntegrityError, match="holds no hash of this index file"):
        load_checked_index(older, older.shards(GALLERY)[0])
    assert not verify_storage(older, str(storage)).ok
    assert adopt_unhashed(older) == [s.index_uri for s in shards]
    assert verify_storage(older, str(storage)).ok
    assert older.committed_outputs(integrity_key(shards[0].index_uri)) == store.committed_outputs(
        integrity_key(shards[0].index_uri))
    older.close()


def test_a_run_checks_the_checkpoint_it_reuses_before_skipping_its_train_step(tmp_path):
    overrides = {"storage": str(tmp_path / "run"), "lineage": f"sqlite:///{tmp_path / 'lineage.db'}"}
    runner = PipelineRunner(load_pipeline("pipelines/lifelong.yaml", overrides), progress=lambda line: None)
    method = create_method("hbct", {"clip": 1.0})
    torch.manual_seed(0)
    model = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=8), 10, range(10))
    uri = runner.generation_uri("g0-old")
    card = save_generation(model, method, None, uri, name="g0-old")
    runner.store.upsert_generation("g0-old", method="hbct")
    runner.store.mark_generation_trained("g0-old", uri, card.sha256, step="train:g0-old",
                                         step_outputs=trained_outputs(uri, card.sha256))
    assert runner._step("train:g0-old", lambda key: pytest.fail("a committed step ran again")) is False
    card_file = Path(uri) / "card.json"
    document = json.loads(card_file.read_text())
    document["method"]["params"]["clip"] = 2.0
    card_file.write_text(json.dumps(document))
    with pytest.raises(IntegrityError, match="card of generation 'g0-old' changed since training"):
        runner._step("train:g0-old", lambda key: pytest.fail("a committed step ran again"))
