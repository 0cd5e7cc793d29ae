"""Pickle-free byte containers of the indexes: one header format, two layouts.

Every serialised index starts with a magic string (8 bytes), a 4-byte little-endian header length
and a UTF-8 JSON header (``pack_header`` / ``unpack_header``), so that a loader can dispatch on the
first 8 bytes. What follows the header:

* ``ShardIndex`` (magic ``ORCHIDX1``): the FAISS bytes, their sha256 in the header;
* the compressed indexes (binary and PQ, magic ``MAGIC`` = ``ORCHCMP1``, ``pack`` / ``unpack``): named
  binary sections back to back; the header lists them in order, each with its length and sha256
  (``{"sections": [{"name", "bytes", "sha256"}, ...]}``), next to the index's own fields.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

#: First bytes of every serialised compressed index.
MAGIC = b"ORCHCMP1"
FORMAT_VERSION = 1


def pack_header(magic: bytes, header: dict[str, Any]) -> bytes:
    """``magic``, 4-byte little-endian length, JSON ``header`` (sorted keys, no NaN)."""
    raw = json.dumps(header, sort_keys=True, allow_nan=False).encode("utf-8")
    return magic + struct.pack("<I", len(raw)) + raw


def unpack_header(data: bytes, magic: bytes, what: str, format_version: int) -> tuple[dict[str, Any], int]:
    """Inverse of ``pack_header``: ``(header, offset of the first byte after it)``.

    ValueError naming ``what`` (e.g. "ShardIndex") for bad magic bytes, a truncated or invalid
    header, or a ``format_version`` other than ``format_version``.
    """
    prefix = len(magic) + 4
    if len(data) < prefix or not data.startswith(magic):
        raise ValueError(f"data is not a serialised {what} (bad magic bytes)")
    (length,) = struct.unpack("<I", data[len(magic):prefix])
    if len(data) < prefix + length:
        raise ValueError(f"data is truncated: the {what} header is incomplete")
    try:
        header = json.loads(data[prefix:prefix + length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"data has an invalid {what} header: {exc}") from None
    if not isinstance(header, dict) or header.get("format_version") != format_version:
        raise ValueError(f"unsupported {what} format: {header!r}")
    return header, prefix + length


def pack(header: dict[str, Any], sections: dict[str, bytes]) -> bytes:
    """``MAGIC``, header length, JSON header (with ``format_version`` and the section table), sections."""
    table = [{"name": name, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
             for name, blob in sections.items()]
    return pack_header(MAGIC, dict(header, format_version=FORMAT_VERSION, sections=table)) + b"".join(sections.values())


def unpack(data: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Inverse of ``pack``: ``(header, sections)``; ValueError for anything that is not intact."""
    data = bytes(data)
    header, offset = unpack_header(data, MAGIC, "compressed index", FORMAT_VERSION)
    sections: dict[str, bytes] = {}
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
