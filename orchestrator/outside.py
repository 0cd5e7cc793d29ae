"""The outside systems a command talks to (S3, PostgreSQL, SQLite, Ray): checked before the
command creates a lineage or a lock, and their failures told as one line.

``preflight(config, ...)`` checks a command's inputs up front: the storage (a local folder that
must exist for a reader, or an S3 bucket that must answer within ``ray.connect_timeout_s``), the lineage URL (a SQLite
path that names a folder), the local data the sources read (an image folder that is not there),
and the Ray address (a ``host:port`` or ``ray://host:port`` nothing
answers on fails after ``ray.connect_timeout_s`` instead of Ray's own minutes of retries). It
also notes these locations, so that a later failure of one of these systems is told by
``explain`` as ``OutsideSystemError``: the system, its location (credentials redacted, also in
URLs: ``redact_uri``) and what to check (the CLI's exit code 6, docs/cli.md).
"""
from __future__ import annotations

import socket
import sys
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from orchestrator.errors import ExitCode, OrchestratorError
from orchestrator.storage.filesystem import is_local, open_filesystem, redact_uri

#: The S3 (botocore) settings of the reachability check: one attempt, bounded by the timeout.
_ONE_ATTEMPT = {"max_attempts": 1, "mode": "standard"}


class OutsideSystemError(OrchestratorError):
    """An outside system (S3, PostgreSQL, SQLite, Ray) did not answer or refused: one line naming
    the system, its location (redacted) and what to check."""

    exit_code = ExitCode.UNREACHABLE
    reported_as = "unreachable"

    def __init__(self, system: str, location: str, problem: str, check: str):
        self.system, self.location = system, location
        super().__init__(f"{system} at {location}: {problem}; check {check}")


@dataclass(frozen=True)
class Locations:
    """Where a command's outside systems are: storage root, lineage URL, Ray address."""

    storage: str | None = None
    lineage: str | None = None
    ray_address: str | None = None


_noted: ContextVar[Locations] = ContextVar("outside_locations", default=Locations())  # noqa: B039 (Locations is frozen)  # noqa: B039 (Locations is frozen)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300] or type(error).__name__


def lineage_location(url: Any) -> str:
    """A lineage URL as it may be shown: the password hidden."""
    from orchestrator.lineage.sessions import normalise_url

    try:
        return normalise_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL: shown without anything that looks like credentials
        return redact_uri(str(url))


def note(locations: Locations) -> None:
    """Note where this command's outside systems are, for ``explain`` (``preflight`` does)."""
    _noted.set(locations)


def preflight(config, *, storage_must_exist: bool, ray: bool = False) -> None:
    """Check ``config``'s storage, lineage URL and (``ray``) Ray address before anything is created
    (module docstring); note them for ``explain``. A reader (``storage_must_exist``) needs a
    storage that exists."""
    timeout_s = config.ray.connect_timeout_s
    note(Locations(config.storage, str(config.lineage), config.ray.address if ray else None))
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
        raise OutsideSystemError("S3", redact_uri(storage), f"access denied ({_one_line(error)})",
                                 "the credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE) and the bucket's policy") from None
    except Exception as error:
        raise _s3_error(storage, error) from None


def _s3_error(storage: str, error: BaseException) -> OutsideSystemError:
    import os

    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS's default"
    return OutsideSystemError("S3", redact_uri(storage), f"{redact_uri(_one_line(error))} (endpoint "
                              f"{redact_uri(endpoint)})", "that the endpoint (AWS_ENDPOINT_URL_S3) is up and "
                              "reachable, and the credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE)")


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
            "Ray", address, f"nothing answers within {timeout_s:g} s ({_one_line(error)})",
            "that the cluster's head runs there (`ray status --address HOST:PORT`), the port (6379, or 10001 for "
            "ray://) and the firewall; ray.connect_timeout_s sets the wait") from None


def explain(error: BaseException) -> OutsideSystemError | None:
    """``error`` as the outside system's one line, when it is one (a database, S3 or Ray failure
    of the command whose locations ``preflight`` noted); None otherwise."""
    if isinstance(error, OutsideSystemError):
        return error
    noted = _noted.get()
    database = sys.modules.get("sqlalchemy.exc")  # an SQLAlchemy error exists only once it was imported
    database_unusable = database is not None and (
        isinstance(error, (database.OperationalError, database.InterfaceError)) or type(error) is database.DatabaseError)
    if database_unusable and noted.lineage is not None:  # not a constraint's or a statement's error
        location = lineage_location(noted.lineage)
        cause = _one_line(getattr(error, "orig", None) or error)
        if location.startswith("sqlite"):
            return OutsideSystemError("SQLite", location, cause, "that the file is a lineage database you may "
                                      "read and write, and its folder exists and is writable")
        return OutsideSystemError("PostgreSQL", location, cause, "that the server runs and accepts this user "
                                  "(PGPASSWORD or ~/.pgpass; never a password in the URL) and the database exists")
    module = type(error).__module__ or ""
    if module.startswith(("botocore", "aiobotocore", "aiohttp", "s3fs")) and noted.storage is not None:
        return _s3_error(noted.storage, error)
    if isinstance(error, ConnectionError) and noted.ray_address is not None and "ray" in _one_line(error).lower():
        return OutsideSystemError("Ray", noted.ray_address, _one_line(error), "that the cluster's head runs there "
                                  "and its Ray version is this one's")
    return None
