"""The served run of g0-old that the pipeline's end-to-end tests share (``conftest.g0_run``): its
pipeline file, and how a test writes one for a copy."""
from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def g0_config() -> dict:
    """pipelines/lifelong.yaml cut to its first generation (g0-old, one epoch, gate forced), no
    reference, no scenario; the lineage at its default place, a SQLite file inside the storage;
    trained in the driver (``ray.num_workers`` 0, Ray Train's local mode: the same weights as one
    worker, without starting one; tests/distributed/test_ray_train.py checks both)."""
    config = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    config["generations"] = config["generations"][:1]
    config["data"].pop("scenario", None)
    config["evaluation"].pop("reference", None)
    config["generations"][0]["training"]["epochs"] = 1
    config["generations"][0]["gate"] = {"action": "force"}
    config.pop("lineage", None)
    config["ray"]["num_workers"] = 0
    return config


def write_pipeline(path: Path, config: dict, storage: Path) -> Path:
    path.write_text(yaml.safe_dump({**config, "storage": str(storage)}, sort_keys=False))
    return path
