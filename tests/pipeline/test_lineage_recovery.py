"""Honest verification and a lost lineage rebuilt, on copies of the session's served g0-old run
(issue 27, findings 1-4 and 7).

Readers leave the storage as it was (every path with its size and mtime); ``verify`` fails on a
missing or emptied lineage, reports (never aborts on) a plan recorded outside the storage, and
catches changed evaluation embeddings and a changed shard file kept for a rollback; ``gc`` never
follows a link; and a deleted lineage is rebuilt by ``verify --rebuild-lineage`` so that
``search`` returns the very same hits, while weights that disagree with their card are refused.
"""
from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from cli_runs import cli_in_process
from orchestrator.cli import ExitCode
from orchestrator.gallery import read_shard
from orchestrator.integrity import index_record, index_steps
from orchestrator.lineage import LineageStore
from orchestrator.storage import sha256_hex

pytestmark = pytest.mark.e2e

SEARCH = ("--split", "test", "--limit", "6", "-k", "3", "--json")


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folder`` with its size and mtime (ns)."""
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def served(tmp_path, copy_g0_run):
    """(pipeline file, storage folder, working folder) of a fresh copy of the g0-old run."""
    return copy_g0_run(tmp_path), tmp_path / "run", tmp_path


def test_readers_leave_the_storage_byte_for_byte(served):
    pipeline, storage, root = served
    before = listing(storage)
    for command in (["lineage", str(pipeline)], ["lineage", "--lineage", f"sqlite:///{storage}/lineage.db", "--json"],
                    ["search", str(pipeline), *SEARCH], ["verify", str(pipeline)],
                    ["gc", str(pipeline), "--dry-run"], ["schema"], ["methods"]):
        result = cli_in_process(*command, cwd=root)
        assert result.returncode == 0, (command, result.stderr)
        assert listing(storage) == before, command  # no -wal, -shm, lock or rewritten lineage.db


def test_verify_fails_without_a_lineage_and_creates_none(served):
    pipeline, storage, root = served
    database = storage / "lineage.db"
    database.unlink()
    before = listing(storage)
    missing = cli_in_process("verify", str(pipeline), cwd=root)
    assert missing.returncode == ExitCode.USAGE and "no lineage store at" in missing.stderr
    assert listing(storage) == before
    database.write_bytes(b"")  # emptied
    emptied = cli_in_process("verify", str(pipeline), cwd=root)
    assert emptied.returncode == ExitCode.USAGE and "has no lineage tables" in emptied.stderr
    database.unlink()
    LineageStore(database).close()  # a lineage with its tables and nothing in them
    nothing = cli_in_process("verify", str(pipeline), cwd=root)
    assert nothing.returncode == ExitCode.INTEGRITY
    assert "NOTHING CHECKED" in nothing.stdout and "0 file(s) checked" in nothing.stdout


def test_verify_catches_changed_evaluation_embeddings_and_rollback_shards(served):
    pipeline, storage, root = served
    assert cli_in_process("verify", str(pipeline), cwd=root).returncode == 0
    embeddings = storage / "generations" / "g0-old" / "eval-test.safetensors"
    saved = embeddings.read_bytes()
    flip_last_byte(embeddings)
    changed = cli_in_process("verify", str(pipeline), cwd=root)
    assert changed.returncode == ExitCode.INTEGRITY
    assert [line for line in changed.stdout.splitlines() if line.startswith("MISMATCH")] == [
        line for line in changed.stdout.splitlines() if str(embeddings) in line and "evaluation embeddings" in line]
    embeddings.write_bytes(saved)

    # shard 0 moves to a copy of its files: the deployment's own files are now kept for a rollback
    store = LineageStore(storage / "lineage.db", storage=storage)
    shard = store.shards("digits-test")[0]
    old = Path(shard.embeddings_uri)
    new = old.with_name("g0-old.000000000000.parquet")
    shutil.copyfile(old, new)
    shutil.copyfile(shard.index_uri, new.with_suffix(".index"))
    index = new.with_suffix(".index")
    store.assign_shard("digits-test", 0, "g0-old", str(new), str(index), sha256_hex(new.read_bytes()), shard.n_items,
                       with_steps=index_steps([(str(index), index_record(index.read_bytes(), read_shard(str(new)).ids))]))
    store.close()
    assert cli_in_process("verify", str(pipeline), cwd=root).returncode == 0
    flip_last_byte(old)
    rollback = cli_in_process("verify", str(pipeline), cwd=root)
    assert rollback.returncode == ExitCode.INTEGRITY
    mismatches = [line for line in rollback.stdout.splitlines() if line.startswith("MISMATCH")]
    assert len(mismatches) == 1 and "kept for a rollback" in mismatches[0] and str(old) in mismatches[0]


def test_a_changed_file_exits_5_whichever_file(served):
    pipeline, storage, root = served
    store = LineageStore(storage / "lineage.db", storage=storage, readonly=True)
    index = Path(store.shards("digits-test")[1].index_uri)
    store.close()
    for changed in (index, storage / "generations" / "g0-old" / "model.safetensors",
                    storage / "generations" / "g0-old" / "card.json"):
        saved = changed.read_bytes()
        flip_last_byte(changed)
        try:
            search = cli_in_process("search", str(pipeline), *SEARCH, cwd=root)
            assert search.returncode == ExitCode.INTEGRITY == 5, (changed, search.stderr)
            assert search.stderr.startswith("orchestrator: integrity: ") and str(changed) in search.stderr
        finally:
            changed.write_bytes(saved)
    assert cli_in_process("search", str(pipeline), *SEARCH, cwd=root).returncode == 0


def test_a_plan_recorded_outside_the_storage_is_reported_not_an_abort(served):
    pipeline, storage, root = served
    with sqlite3.connect(storage / "lineage.db") as db:
        (outputs,) = db.execute("SELECT outputs FROM steps WHERE key LIKE 'plan:%'").fetchone()
        edited = {**json.loads(outputs), "plan_uri": "storage:../../elsewhere/plan.json"}
        db.execute("UPDATE steps SET outputs = ? WHERE key LIKE 'plan:%'", (json.dumps(edited),))
    result = cli_in_process("verify", str(pipeline), cwd=root)
    assert result.returncode == ExitCode.INTEGRITY, result.stderr
    assert "would leave the storage root" in result.stdout and "Traceback" not in result.stderr
    assert "file(s) checked, 1 problem(s)" in result.stdout


def test_gc_never_follows_a_link(served, tmp_path):
    pipeline, storage, root = served
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "g0-old.aaaaaaaaaaaa.parquet").write_bytes(b"not the storage's")
    link = storage / "galleries" / "digits-test" / "shard-00009"
    link.symlink_to(outside, target_is_directory=True)
    result = cli_in_process("gc", str(pipeline), cwd=root)
    assert result.returncode == 0, result.stderr
    assert "left 1 link(s) alone" in result.stdout
    assert link.is_symlink() and (outside / "g0-old.aaaaaaaaaaaa.parquet").read_bytes() == b"not the storage's"


def test_a_deleted_lineage_is_rebuilt_and_search_returns_the_same_hits(served):
    pipeline, storage, root = served
    before = cli_in_process("search", str(pipeline), *SEARCH, cwd=root)
    assert before.returncode == 0, before.stderr
    (storage / "lineage.db").unlink()
    rebuilt = cli_in_process("verify", str(pipeline), "--rebuild-lineage", cwd=root)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert ("rebuilt: 1 generation(s) (g0-old), 4 shard(s), 3 compatibility value(s), serving g0-old on "
            "digits-test") in rebuilt.stdout
    assert "not recovered: the evaluate steps" in rebuilt.stdout
    after = cli_in_process("search", str(pipeline), *SEARCH, cwd=root)
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout) == json.loads(before.stdout)
    again = cli_in_process("verify", str(pipeline), "--rebuild-lineage", cwd=root)
    assert again.returncode == ExitCode.USAGE and "is not empty" in again.stderr


def test_rebuilding_refuses_weights_that_disagree_with_their_card(served):
    pipeline, storage, root = served
    (storage / "lineage.db").unlink()
    flip_last_byte(storage / "generations" / "g0-old" / "model.safetensors")
    rebuilt = cli_in_process("verify", str(pipeline), "--rebuild-lineage", cwd=root)
    assert "REFUSED generation g0-old: its weights hash to" in rebuilt.stdout
    assert "rebuilt: 0 generation(s)" in rebuilt.stdout
    assert rebuilt.returncode == ExitCode.INTEGRITY  # nothing to check: the lineage is still empty
