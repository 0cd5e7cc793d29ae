"""Outside systems that do not answer, bad inputs and non-finite numbers (issue 27, findings 4-6):
one line naming the system, where (credentials redacted) and what to check, the exit code of its
kind, and nothing created before the error. No server is started: the addresses are closed ports."""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from orchestrator.cli import ExitCode, main

REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "pipelines" / "lifelong.yaml"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def one_error_line(capsys) -> str:
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error, error
    return error


def files_under(path: Path) -> list[Path]:
    return sorted(path.rglob("*"))


@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}"])
def test_a_ray_address_that_does_not_answer_fails_in_bounded_time_before_anything_is_created(address, tmp_path,
                                                                                              capsys):
    address = address.format(port=closed_port())
    started = time.perf_counter()
    code = main(["run", str(PIPELINE), "--storage", str(tmp_path / "run"), "--ray-address", address,
                 "--set", "ray.connect_timeout_s=3"])
    assert code == ExitCode.UNREACHABLE == 6
    assert time.perf_counter() - started < 30  # the connection is refused at once; 3 s at most for a silent one
    error = one_error_line(capsys)
    assert error.startswith(f"orchestrator: unreachable: Ray at {address}: nothing answers within 3 s")
    assert "ray.connect_timeout_s" in error
    assert files_under(tmp_path) == []  # no storage, no lineage, no lock


def test_an_s3_endpoint_that_does_not_answer_is_one_line_and_creates_no_lineage(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-shown-secret")
    code = main(["run", str(PIPELINE), "--storage", "s3://bucket/run", "--lineage",
                 f"sqlite:///{tmp_path / 'lineage' / 'lineage.db'}", "--set", "ray.connect_timeout_s=2"])
    assert code == ExitCode.UNREACHABLE
    error = one_error_line(capsys)
    assert error.startswith("orchestrator: unreachable: S3 at s3://bucket/run: Could not connect to the endpoint")
    assert "check that the endpoint (AWS_ENDPOINT_URL_S3) is up" in error and "not-shown-secret" not in error
    assert files_under(tmp_path) == []


def test_credentials_in_an_s3_storage_url_are_refused_and_never_printed(tmp_path, capsys):
    code = main(["run", str(PIPELINE), "--storage", "s3://user:topsecret@bucket/run",
                 "--lineage", f"sqlite:///{tmp_path / 'lineage.db'}"])
    assert code == ExitCode.USAGE
    error = capsys.readouterr().err
    assert "storage: credentials in the URL are never used" in error and "s3://***@bucket/run" in error
    assert "topsecret" not in error
    assert files_under(tmp_path) == []


def test_a_postgresql_lineage_that_does_not_answer_names_it_without_the_password(capsys):
    url = f"postgresql+psycopg://ann:hunter2@127.0.0.1:{closed_port()}/lineage"
    assert main(["lineage", "--lineage", url]) == ExitCode.UNREACHABLE
    error = one_error_line(capsys)
    assert error.startswith("orchestrator: unreachable: PostgreSQL at postgresql+psycopg://ann:***@127.0.0.1:")
    assert "check that the server runs" in error and "hunter2" not in error


def test_a_sqlite_lineage_url_naming_a_folder_names_the_path(tmp_path, capsys):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    code = main(["run", str(PIPELINE), "--storage", str(tmp_path / "run"), "--lineage", f"sqlite:///{folder}"])
    assert code == ExitCode.USAGE
    assert one_error_line(capsys).startswith(f"orchestrator: error: lineage {folder}: a folder, not a SQLite "
                                             "database file")
    assert files_under(tmp_path) == [folder]


@pytest.mark.parametrize("field, value", [
    ("generations.0.training.lr", ".inf"), ("generations.0.training.weight_decay", ".inf"),
    ("generations.0.training.lr", "-.inf"), ("generations.0.training.min_lr", ".nan"),
    ("generations.0.method.params.lam", ".inf"), ("ray.cpus_per_worker", ".inf")])
def test_non_finite_numbers_are_refused_by_field(field, value, tmp_path, capsys):
    code = main(["run", str(PIPELINE), "--storage", str(tmp_path / "run"), "--set", f"{field}={value}"])
    assert code == ExitCode.USAGE
    error = one_error_line(capsys)
    parts = field.split(".")
    named = f"{parts[0]}[{parts[1]}].{'.'.join(parts[2:])}" if parts[0] == "generations" else field
    assert f"{named}: Input should be a finite number" in error, error
    assert files_under(tmp_path) == []


def test_a_missing_image_folder_is_refused_before_a_lineage_or_lock_exists(tmp_path, capsys):
    (tmp_path / "train").mkdir()
    split_options = f"{{train: {{root: {tmp_path / 'train'}}}, test: {{root: {tmp_path / 'nowhere'}}}}}"
    code = main(["run", str(PIPELINE), "--storage", str(tmp_path / "run"), "--set", "data.source=image_folder",
                 "--set", "data.options={}", "--set", f"data.split_options={split_options}"])
    assert code == ExitCode.USAGE
    assert one_error_line(capsys) == (f"orchestrator: error: data.split_options.test.root: no such file or folder "
                                      f"{tmp_path / 'nowhere'} (source 'image_folder')\n")
    assert files_under(tmp_path) == [tmp_path / "train"]  # no storage, lineage or lock

