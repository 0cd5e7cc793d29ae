"""Each command that opens the lineage closes it when it ends (``LineageStore`` as a context
manager): called in this process (as a service or a test calls ``orchestrator.cli.main``), it
leaves no connection, so no open file of the SQLite lineage and no write-ahead log beside it.
Run on a copy of the session's served g0-old run (``conftest.copy_g0_run``)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli_runs import cli_in_process

pytestmark = pytest.mark.e2e


def open_lineage_files(storage: Path) -> list[str]:
    """This process's open files under ``storage`` named lineage.db* (its file descriptors)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        if target.startswith(str(storage)) and Path(target).name.startswith("lineage.db"):
            found.append(target)
    return found


@pytest.mark.parametrize("command", [
    ("lineage",), ("verify",), ("gc", "--dry-run"), ("gc",), ("deploy", "--generation", "g0-old"),
])
def test_the_command_leaves_no_connection_to_the_lineage(command, tmp_path, copy_g0_run):
    pipeline = copy_g0_run(tmp_path)
    storage = tmp_path / "run"
    result = cli_in_process(command[0], str(pipeline), *command[1:], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert open_lineage_files(storage) == []
    assert sorted(p.name for p in storage.glob("lineage.db*")) == ["lineage.db", "lineage.db.run-lifelong.lock"]
