"""A moved storage keeps working (issue 13's "done when"): the lineage records locations relative
to the storage root.

``pipelines/lifelong.yaml`` cut to its first generation (g0-old, one epoch) runs once through the
CLI (the session's run, copied here: ``conftest.copy_g0_run``); its storage folder, with the SQLite
lineage inside, is then moved elsewhere (the old folder is
gone, so nothing can be read from it) and the pipeline file pointed at the new place. There,
``orchestrator search`` returns exactly the results it returned before the move, ``orchestrator
verify`` passes with no unreferenced file, and a re-run skips every committed step and changes no
stored artefact and no lineage row (but the run's registration: the file's config changed).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli_runs import cli, cli_in_process
from g0_run import g0_config, write_pipeline
from orchestrator.config import load_pipeline
from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import StepKind

pytestmark = pytest.mark.e2e

SEARCH = ("--split", "test", "--limit", "8", "-k", "5", "--json")



def files(storage: Path) -> dict[str, tuple[bytes, int]]:
    """Every stored artefact (checkpoints, shard files, indexes, plans, evaluation embeddings) by
    its path relative to the storage: (content, modification time in ns)."""
    return {str(p.relative_to(storage)): (p.read_bytes(), p.stat().st_mtime_ns)
            for folder in ("generations", "galleries") for p in sorted((storage / folder).rglob("*")) if p.is_file()}


def test_a_moved_storage_serves_verifies_and_resumes(tmp_path, copy_g0_run):
    pipeline = copy_g0_run(tmp_path)
    old, new = tmp_path / "run", tmp_path / "elsewhere" / "moved-run"
    before = cli_in_process("search", str(pipeline), *SEARCH, cwd=tmp_path)
    assert before.returncode == 0, before.stderr[-2000:]

    new.parent.mkdir()
    shutil.move(str(old), str(new))
    assert not old.exists()
    moved = write_pipeline(tmp_path / "g0-moved.yaml", g0_config(), new)
    lineage = load_pipeline(str(moved)).lineage
    assert lineage == f"sqlite:///{new}/lineage.db"

    after = cli_in_process("search", str(moved), *SEARCH, cwd=tmp_path)
    assert after.returncode == 0, after.stderr[-2000:]
    served_before, served_after = json.loads(before.stdout), json.loads(after.stdout)
    assert served_after["results"] == served_before["results"]
    assert len(served_after["results"]) == 8 and all(len(hits) == 5 for hits in served_after["results"])
    assert (served_after["serving"], served_after["searched_items"]) == ("g0-old", 539)

    verify = cli_in_process("verify", str(moved), cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-2000:]
    assert "0 problem(s), 0 unreferenced file(s)" in verify.stdout

    store = LineageStore(lineage, storage=str(new), readonly=True)
    steps = [s.key for s in store.steps() if not s.key.startswith(StepKind.INTEGRITY.prefix)]
    shards = [s for s in store.shards(g0_config()["gallery"]["name"]) if s.n_items]
    assert all(s.status == "committed" for s in store.steps())
    assert store.get_generation("g0-old").checkpoint_uri == str(new / "generations" / "g0-old")
    assert len(shards) == 4 and all(s.index_uri.startswith(f"{new}/galleries/") for s in shards)
    counts = store.row_counts()
    store.close()
    stored = files(new)
    assert len(stored) >= 2 + 2 * len(shards)  # card, weights, a Parquet file and an index per shard

    rerun = cli("run", str(moved), cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stdout[-4000:] + rerun.stderr[-4000:]
    assert " done in " not in rerun.stdout
    assert "Started a local Ray instance" not in rerun.stderr  # nothing to do: no Ray was started
    shard_updates = [key for key in steps if key.startswith(StepKind.EMBED.prefix)]
    assert all(f"{key}: already committed, skipped" in rerun.stdout for key in steps if key not in shard_updates)
    assert f"{len(shard_updates)} shard update(s) of g0-old already committed, skipped" in rerun.stdout
    assert files(new) == stored
    store = LineageStore(lineage, storage=str(new), readonly=True)
    # every row as it was; the pipeline file names another storage, so its run is registered anew
    assert {**store.row_counts(), "pipeline_runs": 1} == counts
    store.close()
