"""Shared by the pipeline's end-to-end tests: one served run of g0-old, made once per session
through the CLI and copied for each test that needs one (the lineage records locations relative
to the storage root, so a copy serves its own files)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from g0_run import g0_config, write_pipeline


@pytest.fixture(scope="session")
def g0_run(tmp_path_factory) -> Path:
    """The storage folder (lineage inside) of one ``orchestrator run`` of ``g0_config()``."""
    root = tmp_path_factory.mktemp("g0-run")
    pipeline = write_pipeline(root / "g0.yaml", g0_config(), root / "run")
    run = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(pipeline)], cwd=root,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return root / "run"


@pytest.fixture(scope="session")
def copy_g0_run(g0_run) -> Callable[[Path], Path]:
    """``copy_g0_run(folder)``: the session's g0-old run copied to ``folder/run`` (never the
    original, which other tests copy too); returns the pipeline file ``folder/g0.yaml`` naming it."""
    def copy(folder: Path) -> Path:
        shutil.copytree(g0_run, folder / "run")
        return write_pipeline(folder / "g0.yaml", g0_config(), folder / "run")
    return copy
