"""Pickle-free byte container of the compressed indexes (binary and PQ).

Layout: ``MAGIC`` (8 bytes), 4-byte little-endian header length, a UTF-8 JSON header, then the
named binary sections back to back. The header lists the sections in order, each with its length
and sha256 (``{"sections": [{"name", "bytes", "sha256"}, ...]}``), next to the index's own fields.
Distinct from ``ShardIndex``'s ``ORCHIDX1`` so that a loader can dispatch on the first 8 bytes.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

#: First bytes of every serialised compressed index.
MAGIC = b"ORCHCMP1"
FORMAT_VERSION = 1
_PREFIX = len(MAGIC) + 4


def pack(header: dict[str, Any], sections: dict[str, bytes]) -> bytes:
    """``MAGIC``, header length, JSON header (with ``format_version`` and the section table), sections."""
    table = [{"name": name, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
             for name, blob in sections.items()]
    raw = json.dumps(dict(header, format_version=FORMAT_VERSION, sections=table), sort_keys=True,
                     allow_nan=False).encode("utf-8")
    return MAGIC + struct.pack("<I", len(raw)) + raw + b"".join(sections.values())


def unpack(data: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Inverse of ``pack``: ``(header, sections)``; ValueError for anything that is not intact."""
    data = bytes(data)
    if len(data) < _PREFIX or not data.startswith(MAGIC):
        raise ValueError("data is not a serialised compressed index (bad magic bytes)")
    (length,) = struct.unpack("<I", data[len(MAGIC):_PREFIX])
    if len(data) < _PREFIX + length:
        raise ValueError("data is truncated: the compressed index header is incomplete")
    try:
        header = json.loads(data[_PREFIX:_PREFIX + length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"data has an invalid compressed index header: {exc}") from None
    if not isinstance(header, dict) or header.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"unsupported compressed index format: {header!r}")
    sections: dict[str, bytes] = {}
    offset = _PREFIX + length
    try:
        for entry in header["sections"]:
            blob = data[offset:offset + int(entry["bytes"])]
            offset += int(entry["bytes"])
            if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
                raise ValueError(f"data is corrupt or truncated: the checksum of section {entry['name']!r} does not match")
            sections[entry["name"]] = blob
    except (KeyError, TypeError) as exc:
        raise ValueError(f"data has an invalid compressed index section table: {exc!r}") from None
    if offset != len(data):
        raise ValueError(f"data has {len(data) - offset} trailing bytes after the last section")
    return header, sections
