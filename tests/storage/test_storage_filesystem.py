"""orchestrator.storage.filesystem: URIs, atomic writes, JSON, listing, removal, redaction (local)."""
import logging
import os
import re

import pytest

from orchestrator.storage import (
    exists,
    join_uri,
    list_dir,
    open_filesystem,
    read_bytes,
    read_json,
    redact_options,
    redact_uri,
    remove,
    write_bytes_atomic,
    write_json_atomic,
)
from orchestrator.storage import filesystem as fsmod


def test_join_uri_keeps_scheme_and_collapses_slashes():
    assert join_uri("s3://bucket/prefix", "gen0", "model.safetensors") == "s3://bucket/prefix/gen0/model.safetensors"
    assert join_uri("s3://bucket/prefix/", "gen0/") == "s3://bucket/prefix/gen0"
    assert join_uri("/data", "a", "", "b") == "/data/a/b"
    assert join_uri("/data", "plans/g1.json") == "/data/plans/g1.json"
    assert join_uri("file:///data", "x") == "file:///data/x"


@pytest.mark.parametrize("part", ["..", ".", "a/../b", "../x", "a/.", "/abs", "/gen0/", "a\\b", "..\\x",
                                  "a\0b", "s3://other/bucket"])
def test_join_uri_refuses_a_part_that_leaves_the_base(part):
    with pytest.raises(ValueError, match="would leave"):
        join_uri("s3://bucket/prefix", "galleries", part)
    with pytest.raises(ValueError, match="would leave"):
        join_uri("/data/run", part, "x.json")


def test_open_filesystem_local_and_file_uri(tmp_path):
    fs, path = open_filesystem(str(tmp_path))
    assert fs.protocol[0] in ("file", "local") and path == str(tmp_path)
    fs, path = open_filesystem(f"file://{tmp_path}/x")
    assert path == f"{tmp_path}/x"


def test_open_filesystem_s3_endpoint_from_options_and_env(fake_aws_credentials, monkeypatch):
    import s3fs
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    try:
        fs, path = open_filesystem("s3://bucket/prefix/gen0")
        assert isinstance(fs, s3fs.S3FileSystem) and path == "bucket/prefix/gen0"
        assert fs.endpoint_url == "http://127.0.0.1:1"
        fs2, _ = open_filesystem("s3://bucket/p", {"endpoint_url": "http://127.0.0.1:2"})
        assert fs2.endpoint_url == "http://127.0.0.1:2"
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_write_read_roundtrip_creates_parents(tmp_path):
    uri = str(tmp_path / "a" / "b" / "blob.bin")
    write_bytes_atomic(uri, b"hello")
    assert read_bytes(uri) == b"hello" and exists(uri)
    write_bytes_atomic(uri, b"world!")
    assert read_bytes(f"file://{uri}") == b"world!"
    assert os.listdir(tmp_path / "a" / "b") == ["blob.bin"]  # no temporary files left


def test_atomic_write_failure_midway_keeps_old_content_and_no_temp(tmp_path, monkeypatch):
    uri = str(tmp_path / "card.json")
    write_bytes_atomic(uri, b"old content")

    def half_then_fail(handle, data):
        handle.write(data[: len(data) // 2])
        handle.flush()
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(fsmod, "_write_all", half_then_fail)
    with pytest.raises(OSError, match="simulated"):
        write_bytes_atomic(uri, b"new content that never lands" * 100)
    assert read_bytes(uri) == b"old content"
    assert os.listdir(tmp_path) == ["card.json"]


def test_atomic_write_failure_before_replace_on_new_file_leaves_nothing(tmp_path, monkeypatch):
    uri = str(tmp_path / "new.bin")

    def fail_fsync(fd):
        raise OSError("fsync failed (simulated)")

    monkeypatch.setattr(fsmod.os, "fsync", fail_fsync)
    with pytest.raises(OSError, match="simulated"):
        write_bytes_atomic(uri, b"x" * 1000)
    assert os.listdir(tmp_path) == []


def test_a_durable_write_syncs_the_file_and_its_folder_and_a_non_durable_one_neither(tmp_path, monkeypatch):
    """``write_bytes_atomic`` fsyncs the file, then its folder; ``durable=False`` neither, and the
    file is still replaced whole (no temporary left)."""
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(fsmod.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    write_bytes_atomic(str(tmp_path / "shard.bin"), b"x" * 1000)
    assert len(synced) == 2
    synced.clear()
    write_bytes_atomic(str(tmp_path / "part.bin"), b"old")
    synced.clear()
    write_bytes_atomic(str(tmp_path / "part.bin"), b"y" * 1000, durable=False)
    assert synced == [] and read_bytes(str(tmp_path / "part.bin")) == b"y" * 1000
    assert sorted(os.listdir(tmp_path)) == ["part.bin", "shard.bin"]


def test_atomic_write_file_mode_follows_umask(tmp_path):
    uri = str(tmp_path / "f.bin")
    write_bytes_atomic(uri, b"x")
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(uri).st_mode & 0o777 == 0o666 & ~umask


def test_json_roundtrip_and_strictness(tmp_path):
    uri = str(tmp_path / "doc.json")
    write_json_atomic(uri, {"b": [1, 2.5, None], "a": "é"})
    assert read_json(uri) == {"a": "é", "b": [1, 2.5, None]}
    with pytest.raises(ValueError):
        write_json_atomic(uri, {"x": float("nan")})
    assert read_json(uri)["a"] == "é"
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ValueError, match="bad.json"):
        read_json(str(tmp_path / "bad.json"))


def test_missing_file_errors_name_the_uri(tmp_path):
    uri = str(tmp_path / "missing.bin")
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        read_bytes(uri)
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        remove(uri)
    remove(uri, missing_ok=True)
    with pytest.raises(FileNotFoundError, match="nodir"):
        list_dir(str(tmp_path / "nodir"))


def test_list_dir_and_remove(tmp_path):
    base = str(tmp_path / "root")
    write_bytes_atomic(join_uri(base, "b.bin"), b"1")
    write_bytes_atomic(join_uri(base, "a", "x.bin"), b"2")
    assert list_dir(base) == ["a", "b.bin"]
    with pytest.raises(IsADirectoryError):
        remove(join_uri(base, "a"))
    remove(join_uri(base, "a"), recursive=True)
    remove(join_uri(base, "b.bin"))
    assert list_dir(base) == [] and not exists(join_uri(base, "a"))


def test_redaction_hides_secrets(caplog):
    options = {"key": "AKIAXXXX", "secret": "s3cr3t", "token": "tok", "endpoint_url": "http://u:pw@host:9000",
               "client_kwargs": {"aws_secret_access_key": "s2", "region_name": "eu-west-1"}}
    safe = redact_options(options)
    text = repr(safe)
    for secret in ("AKIAXXXX", "s3cr3t", "tok'", "pw@", "s2"):
        assert secret not in text
    assert safe["client_kwargs"]["region_name"] == "eu-west-1"
    assert redact_uri("s3://bucket/p?X-Amz-Signature=abc&x=1") == "s3://bucket/p?X-Amz-Signature=***&x=1"
    assert "pw" not in redact_uri("https://user:pw@host/path")


def test_open_filesystem_never_logs_credentials(caplog, monkeypatch):
    import s3fs
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    with caplog.at_level(logging.DEBUG, logger="orchestrator.storage.filesystem"):
        open_filesystem("s3://bucket/x", {"key": "AKIAVERYSECRET", "secret": "hunter2", "endpoint_url": "http://127.0.0.1:1"})
    s3fs.S3FileSystem.clear_instance_cache()
    assert caplog.records and "AKIAVERYSECRET" not in caplog.text and "hunter2" not in caplog.text


def test_an_object_store_that_does_not_answer_is_one_line_naming_the_uri_and_endpoint(monkeypatch):
    import socket

    from orchestrator.errors import ExitCode, OutsideSystemError

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDNOTSHOWN")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-shown-secret")
    options = {"endpoint_url": endpoint, "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}}}
    operations = {
        "s3://bucket/run/a.json": lambda uri: read_bytes(uri, options),
        "s3://bucket/run/b.json": lambda uri: write_bytes_atomic(uri, b"{}", options),
        "s3://bucket/run": lambda uri: list_dir(uri, options),
        "s3://bucket/run/c": lambda uri: exists(uri, options),
        "s3://bucket/run/d": lambda uri: remove(uri, missing_ok=True, storage_options=options),
    }
    for uri, operation in operations.items():
        with pytest.raises(OutsideSystemError) as caught:
            operation(uri)
        message = str(caught.value)
        assert message.startswith(f"S3 at {uri}: Could not connect to the endpoint URL") and "\n" not in message
        assert f"(endpoint {endpoint}); check that the endpoint (AWS_ENDPOINT_URL_S3) is up" in message
        assert "not-shown-secret" not in message and "AKIDNOTSHOWN" not in message
        assert caught.value.exit_code == ExitCode.UNREACHABLE
        assert type(caught.value.__cause__).__module__.startswith("botocore")  # the client's own error, chained


def test_a_versioned_document_is_read_up_to_the_newest_version_this_code_knows(tmp_path):
    from orchestrator.storage.filesystem import read_versioned_json

    folder = str(tmp_path / "gen0")
    with pytest.raises(FileNotFoundError, match=f"^no checkpoint card \\(card.json\\) at {re.escape(folder)}$"):
        read_versioned_json(folder, "card.json", "checkpoint card", 2)
    for version in (1, 2):
        write_json_atomic(join_uri(folder, "card.json"), {"format_version": version, "x": 1})
        assert read_versioned_json(folder, "card.json", "checkpoint card", 2) == {"format_version": version, "x": 1}
    for document, shown in (({"format_version": 3}, "3"), ({"format_version": "2"}, "'2'"), ([2], "None")):
        write_json_atomic(join_uri(folder, "card.json"), document)
        with pytest.raises(ValueError, match=f"^{re.escape(folder)}/card.json: unsupported checkpoint card format_version "
                                             f"{shown} \\(this code reads up to 2\\)$"):
            read_versioned_json(folder, "card.json", "checkpoint card", 2)


def test_lance_reaches_s3_through_the_storages_own_endpoint(monkeypatch):
    """``object_store_options``: the endpoint every fsspec client of the storage uses
    (``s3_endpoint``: the options', else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL), and allow_http
    only for plain http; nothing for a local path or without an endpoint (AWS's default)."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    assert fsmod.object_store_options("s3://b/x") == {}
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    assert fsmod.object_store_options("s3://b/x") == {"aws_endpoint": "http://127.0.0.1:9000", "allow_http": "true"}
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://minio.internal")
    assert fsmod.object_store_options("s3a://b/x") == {"aws_endpoint": "https://minio.internal"}
    assert fsmod.object_store_options("s3://b/x", {"client_kwargs": {"endpoint_url": "http://h:1"}}) == {
        "aws_endpoint": "http://h:1", "allow_http": "true"}
    assert fsmod.object_store_options("/data/lance") == {} == fsmod.object_store_options("file:///data/lance")
