"""The outside systems a command talks to (S3, PostgreSQL, SQLite, Ray): checked before the
command creates a lineage or a lock.

``preflight(config, ...)`` checks a command's inputs up front: the storage (a local folder that
must exist for a reader, or an S3 bucket that must answer within ``ray.connect_timeout_s``), the lineage URL (a SQLite
path that names a folder), the local data the sources read (an image folder that is not there),
and the Ray address (a ``host:port`` or ``ray://host:port`` nothing
answers on fails after ``ray.connect_timeout_s`` instead of Ray's own minutes of retries).

A later failure of one of these systems is translated where it arises into ``OutsideSystemError``
(the system, its location with credentials redacted, what to check; the CLI's exit code 6,
docs/cli.md): by the lineage store's engine (``lineage.sessions.unusable``), the storage's file
operations (``storage.filesystem.s3_unreachable``) and joining a Ray cluster
(``distributed.runtime.connect``). ``preflight`` also notes the storage, so that ``explain`` tells an
object store's error raised outside those file operations (a file system opened directly) the
same way.
"""
from __future__ import annotations

import socket
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

from orchestrator.errors import OutsideSystemError, one_line
from orchestrator.storage.filesystem import (
    is_local,
    is_object_store_error,
    open_filesystem,
    redact_uri,
    s3_unreachable,
)

#: The S3 (botocore) settings of the reachability check: one attempt, bounded by the timeout.
_ONE_ATTEMPT = {"max_attempts": 1, "mode": "standard"}


#: The storage of this command, noted by ``preflight`` for ``explain``.
_noted_storage: ContextVar[str | None] = ContextVar("outside_storage", default=None)


def preflight(config, *, storage_must_exist: bool, ray: bool = False) -> None:
    """Check ``config``'s storage, lineage URL and (``ray``) Ray address before anything is created
    (module docstring); note the storage for ``explain``. A reader (``storage_must_exist``) needs a
    storage that exists."""
    timeout_s = config.ray.connect_timeout_s
    _noted_storage.set(config.storage)
    check_storage(config.storage, must_exist=storage_must_exist, timeout_s=timeout_s)
    check_lineage_url(config.lineage)
    check_data_paths(config)
    if ray:
        check_ray_address(config.ray.address, timeout_s)


def check_storage(storage: str, *, must_exist: bool, timeout_s: float) -> None:
    """ValueError for a local storage that is a file, or missing when it ``must_exist``;
    OutsideSystemError for an S3 bucket that does not answer (or does not exist) within
    ``timeout_s``."""
    import os

    if is_local(storage):
        path = os.path.abspath(os.path.expanduser(storage.removeprefix("file://")))
        if os.path.exists(path) and not os.path.isdir(path):
            raise ValueError(f"storage {path}: a file, not a folder")
        if must_exist and not os.path.isdir(path):
            raise ValueError(f"storage {path}: no such folder (nothing was run there)")
        return
    parts = urlsplit(storage)  # credentials in the URL were refused with the pipeline file
    if parts.scheme not in ("s3", "s3a"):
        return
    options = {"config_kwargs": {"connect_timeout": timeout_s, "read_timeout": timeout_s, "retries": _ONE_ATTEMPT},
               "skip_instance_cache": True}
    try:
        fs, _path = open_filesystem(storage, options)
        fs.ls(parts.netloc, refresh=True)
    except FileNotFoundError:
        raise OutsideSystemError("S3", redact_uri(storage), f"bucket {parts.netloc!r} does not exist",
                                 "the bucket name and the endpoint (AWS_ENDPOINT_URL_S3)") from None
    except PermissionError as error:
        raise OutsideSystemError("S3", redact_uri(storage), f"access denied ({one_line(error)})",
                                 "the credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE) and the bucket's policy") from None
    except Exception as error:
        raise s3_unreachable(storage, error) from None


def check_data_paths(config) -> None:
    """ValueError naming the field for a local data folder or file the pipeline's sources read
    (``EXISTING_DATA_OPTIONS``: image folders, Parquet files) that does not exist."""
    import os

    from orchestrator.data.registry import EXISTING_DATA_OPTIONS

    data = config.data
    places = [("data.options", data.source, data.options)]
    places += [(f"data.split_options.{split}", data.source, {**data.options, **options})
               for split, options in data.split_options.items()]
    if config.gallery.source is not None:
        places.append(("gallery.options", config.gallery.source, config.gallery.options or {}))
    for where, source, options in places:
        option = EXISTING_DATA_OPTIONS.get(source)
        value = options.get(option) if option else None
        if isinstance(value, (str, os.PathLike)) and is_local(os.fspath(value)):
            path = os.path.expanduser(os.fspath(value).removeprefix("file://"))
            if not os.path.exists(path):
                raise ValueError(f"{where}.{option}: no such file or folder {os.path.abspath(path)} "
                                 f"(source {source!r})")


def check_lineage_url(url: Any) -> None:
    """ValueError for a SQLite lineage path that names a folder (or lies under a file)."""
    from pathlib import Path

    from orchestrator.lineage.sessions import normalise_url, sqlite_in_memory

    parsed = normalise_url(url)
    if parsed.get_backend_name() != "sqlite" or sqlite_in_memory(parsed) or (parsed.database or "").startswith("file:"):
        return
    path = Path(parsed.database or "").expanduser()
    if path.is_dir():
        raise ValueError(f"lineage {path}: a folder, not a SQLite database file (name the file, e.g. "
                         f"{path / 'lineage.db'})")
    blocking = next((parent for parent in path.parents if parent.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise ValueError(f"lineage {path}: {blocking} is a file, not a folder")


def check_ray_address(address: str | None, timeout_s: float) -> None:
    """OutsideSystemError when nothing answers on a ``host:port`` / ``ray://host:port`` Ray
    address within ``timeout_s`` (None, "local" and "auto" need no address)."""
    if address in (None, "local", "auto"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as error:
        raise OutsideSystemError(
            "Ray", address, f"nothing answers within {timeout_s:g} s ({one_line(error)})",
            "that the cluster's head runs there (`ray status --address HOST:PORT`), the port (6379, or 10001 for "
            "ray://) and the firewall; ray.connect_timeout_s sets the wait") from None


def explain(error: BaseException) -> OutsideSystemError | None:
    """``error`` as an outside system's one line when it is one: an ``OutsideSystemError`` as it is,
    an object store client's error that escaped the storage's file operations (a file system opened
    directly) as the noted storage's (``s3_unreachable``); None otherwise."""
    if isinstance(error, OutsideSystemError):
        return error
    storage = _noted_storage.get()
    if storage is not None and is_object_store_error(error):
        return s3_unreachable(storage, error)
    return None
