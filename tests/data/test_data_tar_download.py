"""Safe tar extraction and the offline behaviour of download_cifar (no network is touched)."""
from __future__ import annotations

import hashlib
import io
import tarfile
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from orchestrator.data import download_cifar, load_cifar, safe_extract_tar, sources


def add_file(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def build_tar(path: Path, members: list[tuple[str, bytes]], symlink: str | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in members:
            add_file(tar, name, payload)
        if symlink:
            info = tarfile.TarInfo(symlink)
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tar.addfile(info)
    return path


def test_benign_archive_is_extracted(tmp_path):
    archive = build_tar(tmp_path / "ok.tar.gz", [("folder/a.bin", b"abc"), ("folder/sub/b.txt", b"xyz")])
    dest = tmp_path / "out"
    safe_extract_tar(archive, dest)
    assert (dest / "folder" / "a.bin").read_bytes() == b"abc"
    assert (dest / "folder" / "sub" / "b.txt").read_bytes() == b"xyz"


@pytest.mark.parametrize("bad_name", ["../evil.txt", "folder/../../evil.txt", "/tmp/evil_absolute.txt"])
def test_member_escaping_the_destination_is_rejected(tmp_path, bad_name):
    archive = build_tar(tmp_path / "bad.tar.gz", [("folder/fine.txt", b"ok"), (bad_name, b"pwned")])
    dest = tmp_path / "out"
    with pytest.raises(ValueError, match="outside"):
        safe_extract_tar(archive, dest)
    assert not (tmp_path / "evil.txt").exists()
    assert not (dest / "folder" / "fine.txt").exists()  # nothing is extracted from a rejected archive


def test_link_member_is_rejected(tmp_path):
    archive = build_tar(tmp_path / "link.tar.gz", [("folder/fine.txt", b"ok")], symlink="folder/passwd")
    with pytest.raises(ValueError, match="link"):
        safe_extract_tar(archive, tmp_path / "out")


def refuse_network(*args, **kwargs):
    raise urllib.error.URLError("network is unreachable")


def test_offline_download_explains_manual_placement(tmp_path, monkeypatch):
    monkeypatch.setattr(sources.urllib.request, "urlopen", refuse_network)
    with pytest.raises(RuntimeError) as info:
        download_cifar("cifar100", tmp_path)
    message = str(info.value)
    assert "cifar-100-binary.tar.gz" in message and str(tmp_path / "cifar-100-binary") in message
    assert "train.bin" in message
    assert list(tmp_path.iterdir()) == []  # no partial download left behind


def test_archive_placed_by_hand_is_checked_and_extracted_without_network(tmp_path, monkeypatch):
    monkeypatch.setattr(sources.urllib.request, "urlopen", refuse_network)
    record = np.concatenate([[4], np.arange(3072) % 256]).astype(np.uint8).tobytes()
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    archive = tmp_path / "cifar-10-binary.tar.gz"
    build_tar(archive, [(f"cifar-10-batches-bin/{n}", record) for n in names])
    content = archive.read_bytes()
    with pytest.raises(ValueError, match="is not the publisher's c32a1d4ab5d03f1284b67883e8d87530"):
        download_cifar("cifar10", tmp_path)  # not the real archive: refused, and removed
    assert not archive.exists() and not (tmp_path / "cifar-10-batches-bin").exists()
    archive.write_bytes(content)
    monkeypatch.setitem(sources._CIFAR["cifar10"], "md5", hashlib.md5(content).hexdigest())  # as if it were
    folder = download_cifar("cifar10", tmp_path)
    assert folder == tmp_path / "cifar-10-batches-bin"
    data = load_cifar(tmp_path, variant="cifar10", split="train", download=True)
    assert len(data) == 5 and data.labels.tolist() == [4] * 5
    assert data.images[0, 0, 1, 0] == 1 and data.images[0, 0, 0, 1] == 1024 % 256


def test_download_destination_must_be_local():
    with pytest.raises(ValueError, match="dest"):
        download_cifar("cifar10", "s3://bucket/cifar")
