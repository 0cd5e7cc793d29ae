"""Shared by the pipeline's end-to-end tests: one served run of g0-old, made once per test run
through the CLI and copied for each test that needs one (the lineage records locations relative
to the storage root, so a copy serves its own files).

Under ``pytest -n N`` the run is made once for all workers, not once per worker: the first worker
to need it builds it in the run's shared temporary folder while holding a file lock, and the others
wait on the lock and copy the result. So its tests need no common worker and spread over lanes.
tests/serving imports these fixtures too (its own conftest); the folder and the lock make it one
run for both directories, with or without workers."""
from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest

from cli_runs import cli
from g0_run import g0_config, write_pipeline


@pytest.fixture(scope="session")
def g0_run(tmp_path_factory) -> Path:
    """The storage folder (lineage inside) of one ``orchestrator run`` of ``g0_config()``, made
    once per test run (shared by the xdist workers of one run, see the module docstring)."""
    base = tmp_path_factory.getbasetemp()  # a worker's is inside the test run's
    root = (base if os.environ.get("PYTEST_XDIST_WORKER") is None else base.parent) / "g0-run-shared"
    root.mkdir(exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        failure = root / "failed.txt"
        if failure.exists():
            pytest.fail(f"the shared g0-old run failed earlier in this test run:\n{failure.read_text()}")
        if not (root / "done").exists():
            try:
                _build_g0_run(root)
            except BaseException as error:
                failure.write_text(str(error))
                raise
            (root / "done").touch()
    return root / "run"


def _build_g0_run(root: Path) -> Path:
    pipeline = write_pipeline(root / "g0.yaml", g0_config(), root / "run")
    run = cli("run", str(pipeline), cwd=root, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    # the run closed its lineage: SQLite folded its write-ahead log into lineage.db (copies hold all of it)
    assert sorted(p.name for p in (root / "run").glob("lineage.db*")) == ["lineage.db", "lineage.db.run-lifelong.lock"]
    return root / "run"


@pytest.fixture(scope="session")
def copy_g0_run(g0_run) -> Callable[[Path], Path]:
    """``copy_g0_run(folder)``: the session's g0-old run copied to ``folder/run`` (never the
    original, which other tests copy too); returns the pipeline file ``folder/g0.yaml`` naming it."""
    def copy(folder: Path) -> Path:
        shutil.copytree(g0_run, folder / "run")
        return write_pipeline(folder / "g0.yaml", g0_config(), folder / "run")
    return copy
