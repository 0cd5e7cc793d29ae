"""Tampered storage and a lost lineage, end to end (issue 13's "done when").

``pipelines/lifelong.yaml`` cut to its first generation (g0-old, one epoch) runs through the CLI.
Then each kind of stored file is changed in place, one at a time: the card's ``clip``, the
weights, an index header's curvature, an index payload byte, one shard's index replaced by
another's, a shard's Parquet file. Each change is refused (opening the search router raises,
naming the file, or ``orchestrator verify`` exits 1 naming it) and never served; after restoring
the file, everything verifies and serves again. Last, the lineage file is emptied and the run is
repeated: it stops, naming the storage, and no stored file changes (counted and hashed).
"""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from cli_runs import cli, cli_in_process
from orchestrator.config import load_pipeline
from orchestrator.integrity import IntegrityError
from orchestrator.lineage import LineageStore
from orchestrator.pipeline.verify import stored_files, verify_storage
from orchestrator.search.service import open_router
from orchestrator.storage import ChecksumMismatch

pytestmark = pytest.mark.e2e




@pytest.fixture(scope="module")
def served(tmp_path_factory, copy_g0_run):
    """(pipeline file, its config, working directory): a copy of the session's g0-old run."""
    root = tmp_path_factory.mktemp("integrity")
    path = copy_g0_run(root)
    return path, load_pipeline(str(path)), root


def _hashes(storage: str) -> dict[str, str]:
    return {path: hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in stored_files(storage)}


def _tamper_card(shards, checkpoint: Path) -> Path:
    card = checkpoint / "card.json"
    document = json.loads(card.read_text())
    assert document["method"]["params"]["clip"] == 1.0
    document["method"]["params"]["clip"] = 2.0
    card.write_text(json.dumps(document))
    return card


def _flip_last_byte(path: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def _tamper_weights(shards, checkpoint: Path) -> Path:
    return _flip_last_byte(checkpoint / "model.safetensors")


def _tamper_index_header(shards, checkpoint: Path) -> Path:
    path = Path(shards[0].index_uri)
    data = path.read_bytes()
    (length,) = struct.unpack("<I", data[8:12])
    header = json.loads(data[12:12 + length])
    header["curv"] = header["curv"] * 2
    raw = json.dumps(header, sort_keys=True).encode()
    path.write_bytes(data[:8] + struct.pack("<I", len(raw)) + raw + data[12 + length:])
    return path


def _tamper_index_payload(shards, checkpoint: Path) -> Path:
    return _flip_last_byte(Path(shards[1].index_uri))


def _swap_index(shards, checkpoint: Path) -> Path:
    path = Path(shards[0].index_uri)
    path.write_bytes(Path(shards[1].index_uri).read_bytes())
    return path


def _tamper_parquet(shards, checkpoint: Path) -> Path:
    return _flip_last_byte(Path(shards[2].embeddings_uri))


@pytest.mark.parametrize("tamper, served_refuses", [
    (_tamper_card, True), (_tamper_weights, True), (_tamper_index_header, True), (_tamper_index_payload, True),
    (_swap_index, True), (_tamper_parquet, False)])
def test_each_tampered_file_is_refused_never_served(served, tamper, served_refuses):
    path, config, root = served
    store = LineageStore(config.lineage, storage=config.storage)
    shards = [s for s in store.shards(config.gallery.name) if s.n_items]
    checkpoint = Path(store.get_generation("g0-old").checkpoint_uri)
    storage = str(Path(config.storage).resolve())
    original = {name: Path(name).read_bytes() for name in stored_files(storage)}
    assert verify_storage(store, storage).ok
    changed = tamper(shards, checkpoint)
    try:
        if served_refuses:
            with pytest.raises((IntegrityError, ChecksumMismatch), match=str(changed)):
                open_router(store, config.gallery.name)
        else:  # the Parquet file is not what search reads: what is served is still the lineage's
            assert open_router(store, config.gallery.name).searchable_items == 539
        verify = cli_in_process("verify", str(path), cwd=root)
        assert verify.returncode == 5, verify.stdout + verify.stderr  # ExitCode.INTEGRITY, whichever file
        mismatches = [line for line in verify.stdout.splitlines() if line.startswith("MISMATCH")]
        assert len(mismatches) == 1 and str(changed) in mismatches[0], verify.stdout
    finally:
        for name, data in original.items():
            Path(name).write_bytes(data)
    assert verify_storage(store, storage).ok
    assert open_router(store, config.gallery.name).searchable_items == 539
    store.close()


def test_an_emptied_lineage_stops_the_run_and_overwrites_nothing(served):
    path, config, root = served
    storage = str(Path(config.storage).resolve())
    database = Path(storage) / "lineage.db"
    saved = database.read_bytes()
    before = _hashes(storage)
    assert len(before) >= 2 + 2 * 4 + 1  # card, weights, 4 shards' Parquet and index files, a plan
    database.write_bytes(b"")
    try:
        run = cli("run", str(path), cwd=root)
        assert run.returncode != 0
        assert f"is empty but storage {storage} holds {len(before)} artefact file(s)" in run.stdout + run.stderr
        assert _hashes(storage) == before
    finally:
        database.write_bytes(saved)
