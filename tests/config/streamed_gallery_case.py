"""A pipeline mapping with a streamed Parquet gallery, for the config tests."""
from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def streamed_config() -> dict:
    config = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    config["gallery"] = {"name": "photos", "source": "parquet_dataset", "items_per_shard": 100,
                         "options": {"path": "s3://bucket/gallery/", "uri_column": "key",
                                     "metadata_columns": ["caption"]}}
    return config
