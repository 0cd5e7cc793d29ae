"""Storage: fsspec file systems (local paths, ``file://``, ``s3://`` through s3fs) with atomic
writes, and generation checkpoints (safetensors + JSON card with sha256) and training state.

No Ray here: the pipeline and the Ray layer call these functions from wherever they run.
"""
from orchestrator.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "checkpoints": [
        "CARD_FILE", "CARD_FORMAT_VERSION", "WEIGHTS_FILE", "CheckpointCard", "MethodSpec",
        "TrainingState", "checkpoint_exists", "describe_adapters", "load_card", "load_generation",
        "load_training_state", "rebuild_adapters", "save_generation", "save_training_state",
    ],
    "hashing": ["ChecksumMismatch", "sha256_hex"],
    "filesystem": [
        "exists", "is_local", "join_uri", "list_dir", "open_filesystem", "read_bytes", "read_json",
        "redact_options", "redact_uri", "remove", "remove_stale_temporaries", "write_bytes_atomic",
        "write_json_atomic",
    ],
})
