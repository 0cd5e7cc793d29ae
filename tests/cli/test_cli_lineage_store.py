"""The CLI against lineage stores that do not exist (lineage, search: exit 2, one line, nothing
created) and against a pipeline whose run lock another process holds (exit 4, naming it)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "pipelines" / "lifelong.yaml"
HOLDER = """
import sys, time
from orchestrator.config import load_pipeline
from orchestrator.lineage import LineageStore
config = load_pipeline(sys.argv[1], {"storage": sys.argv[2]})
with LineageStore(config.lineage).run_lock(config.name, "orchestrator run"):
    print("locked", flush=True)
    time.sleep(120)
"""


def files_under(path: Path) -> list[Path]:
    return sorted(path.rglob("*"))


def one_error_line(capsys) -> str:
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error, error
    return error


NO_STORE = "orchestrator: error: LineageNotFound: no lineage store at sqlite:///{tmp}/runs/none/lineage.db"
NO_STORAGE = "orchestrator: error: storage {tmp}/runs/none: no such folder"


@pytest.mark.parametrize("command, expected", [
    (["lineage", "--lineage", "sqlite:///{tmp}/runs/none/lineage.db"], NO_STORE),
    (["lineage", str(PIPELINE), "--storage", "{tmp}/runs/none"], NO_STORE),
    (["search", str(PIPELINE), "--storage", "{tmp}/runs/none", "--split", "test", "--limit", "2"], NO_STORAGE),
    (["verify", str(PIPELINE), "--storage", "{tmp}/runs/none"], NO_STORAGE),
    (["gc", str(PIPELINE), "--storage", "{tmp}/runs/none", "--dry-run"], NO_STORAGE),
    (["gc", str(PIPELINE), "--storage", "{tmp}/runs/none"], NO_STORAGE),
    (["deploy", str(PIPELINE), "--storage", "{tmp}/runs/none", "--rollback"], NO_STORAGE),
], ids=["lineage-url", "lineage-file", "search", "verify", "gc-dry-run", "gc", "deploy"])
def test_reading_a_sqlite_store_that_does_not_exist_is_exit_2_and_creates_nothing(command, expected, tmp_path, capsys):
    before = files_under(tmp_path)
    assert main([part.replace("{tmp}", str(tmp_path)) for part in command]) == 2
    error = one_error_line(capsys)
    assert error.startswith(expected.replace("{tmp}", str(tmp_path)))
    assert files_under(tmp_path) == before


def test_reading_an_empty_postgresql_database_is_exit_2_and_creates_no_table(postgres_url, capsys):
    assert main(["lineage", "--lineage", postgres_url, "--json"]) == 2
    assert "LineageNotFound" in one_error_line(capsys)
    engine = create_engine(postgres_url)
    with engine.connect() as connection:
        assert inspect(connection).get_table_names() == []
    engine.dispose()


def test_a_pipeline_held_by_another_process_is_exit_4_naming_it(tmp_path, capsys):
    storage = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(PIPELINE), str(storage)], stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for command in (["gc"], ["deploy", "--rollback"]):  # `gc --dry-run` reads only: it takes no lock
            assert main([command[0], str(PIPELINE), "--storage", str(storage), *command[1:]]) == 4
            error = one_error_line(capsys)
            assert error.startswith("orchestrator: busy: pipeline 'lifelong' is held by ")
            assert f"(pid {holder.pid}, orchestrator run)" in error
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


@pytest.mark.parametrize("command", ["run", "tune", "search", "lineage", "deploy", "gc"])
def test_every_command_on_a_pipeline_takes_a_lineage_url(command):
    from orchestrator.cli import build_parser
    from orchestrator.cli_options import pipeline_overrides

    extra = {"search": ["--split", "test"], "deploy": ["--rollback"]}.get(command, [])
    args = build_parser().parse_args([command, "file.yaml", "--lineage", "sqlite:///x/l.db", *extra])
    assert pipeline_overrides(args) == {"lineage": "sqlite:///x/l.db"}


def test_lineage_url_overrides_the_pipeline_files_store(tmp_path, capsys):
    from orchestrator.lineage import LineageStore

    url = f"sqlite:///{tmp_path / 'elsewhere' / 'lineage.db'}"
    store = LineageStore(url)
    store.upsert_generation("only-here", method="independent", params={})
    store.close()
    storage = tmp_path / "run"  # the file's own lineage would be run/lineage.db: it does not exist
    assert main(["lineage", str(PIPELINE), "--storage", str(storage), "--lineage", url]) == 0
    assert "only-here" in capsys.readouterr().out
    assert not storage.exists()
