"""Storage: fsspec file systems (local paths, ``file://``, ``s3://`` through s3fs) with atomic
writes, content hashes, leases and the storage root's locations. What is stored (the checkpoint
format, training state) lives beside what it stores: ``orchestrator.models.checkpoint``,
``orchestrator.training.state``.

No Ray here: the pipeline and the Ray layer call these functions from wherever they run.
"""
from orchestrator.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "hashing": ["ChecksumMismatch", "sha256_hex"],
    "filesystem": [
        "exists", "is_local", "join_uri", "list_dir", "open_filesystem", "read_bytes", "read_json",
        "redact_options", "redact_uri", "remove", "remove_stale_temporaries", "write_bytes_atomic",
        "write_json_atomic",
    ],
})
