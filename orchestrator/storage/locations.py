"""Locations relative to a storage root, so a storage can be moved or copied with its lineage.

The lineage records a location under the pipeline's storage root as ``storage:<relative path>``
(``storage:generations/g0``) and resolves it against the root the current run or command is given
(``StorageRoot.resolve``): a local folder moved elsewhere, or a prefix copied to another bucket
(``s3://a/run`` → ``s3://b/copy``), keeps working with its lineage. A location outside the root
stays absolute, and so does any other string (a generation name, a relative data path).

Resolving goes through ``join_uri``: a recorded relative path that would leave the root (``..``,
a leading ``/``, a ``scheme://``) is refused with a ValueError naming it.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.storage.filesystem import is_local, join_uri, redact_uri

#: Marks a location recorded relative to the storage root.
RELATIVE_PREFIX = "storage:"


def normalise_root(storage: str | os.PathLike) -> str:
    """A storage root as locations under it are written: a local one as an absolute path
    (``file://`` dropped), a remote one as given; never a trailing slash (but ``/`` itself)."""
    text = os.fspath(storage)
    if is_local(text):
        text = os.path.abspath(os.path.expanduser(text.removeprefix("file://")))
    return text.rstrip("/") or "/"


@dataclass(frozen=True)
class StorageRoot:
    """The root locations are recorded relative to (``uri``: a local folder or ``s3://bucket/prefix``)."""

    uri: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "uri", normalise_root(self.uri))

    def relative(self, location: str) -> str:
        """``storage:<path>`` for a location under the root (the root itself: ``storage:``); any
        other string unchanged (outside the root, not a location, already relative)."""
        if not isinstance(location, str) or location.startswith(RELATIVE_PREFIX):
            return location
        candidate = location.removeprefix("file://") if is_local(self.uri) and is_local(location) else location
        if candidate == self.uri:
            return RELATIVE_PREFIX
        base = self.uri if self.uri.endswith("/") else self.uri + "/"
        if not candidate.startswith(base):
            return location
        rest = candidate[len(base):].rstrip("/")
        if any(part in ("", ".", "..") for part in rest.split("/")):
            return location  # not a plain path below the root: kept as written
        return RELATIVE_PREFIX + rest

    def resolve(self, location: str) -> str:
        """The absolute location of ``storage:<path>`` under this root; any other string unchanged.
        ValueError for a relative path that would leave the root."""
        if not isinstance(location, str) or not location.startswith(RELATIVE_PREFIX):
            return location
        try:
            return join_uri(self.uri, location[len(RELATIVE_PREFIX):])
        except ValueError:
            raise ValueError(f"recorded location {location!r} would leave the storage root {redact_uri(self.uri)}; "
                             "refusing it") from None

    def relative_json(self, value: Any) -> Any:
        """``value`` (JSON: dicts, lists, strings…) with every location under the root made relative."""
        return _map_strings(value, self.relative)

    def resolve_json(self, value: Any) -> Any:
        """``value`` with every relative location resolved against this root."""
        return _map_strings(value, self.resolve)


def _map_strings(value: Any, fn) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, Mapping):
        return {key: _map_strings(item, fn) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_strings(item, fn) for item in value)
    return value
