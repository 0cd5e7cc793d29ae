"""The sha256 of stored bytes, and the error of bytes that do not hash to what the lineage holds."""
from __future__ import annotations

import hashlib

from orchestrator.errors import StoredFileError
from orchestrator.storage.filesystem import redact_uri


class ChecksumMismatch(StoredFileError, ValueError):
    """The bytes read from ``uri`` do not hash to the expected sha256."""

    def __init__(self, uri: str, expected: str, actual: str):
        self.uri, self.expected, self.actual = uri, expected, actual
        super().__init__(f"checksum mismatch for {redact_uri(uri)}: expected sha256 {expected}, got {actual}")

    def __reduce__(self):
        # keeps the error intact when it crosses a process boundary (a Ray worker → the driver)
        return (type(self), (self.uri, self.expected, self.actual))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
