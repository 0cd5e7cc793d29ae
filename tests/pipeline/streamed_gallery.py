"""Shared by the streamed-gallery tests: a multi-file, unlabelled Parquet gallery made from the
digits' test split, and a driver that serves generations over it through ``GalleryUpdater``
with untrained checkpoints (no training: what is tested is the data plane).

Run as a script (``python streamed_gallery.py CONFIG.json``) it is the driver process that the
resume test kills and starts again; every step it runs is skipped once committed, as in
``orchestrator run``.
"""
from __future__ import annotations

import functools
import io
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import yaml
from PIL import Image

from orchestrator.config import PipelineConfig
from orchestrator.data import channel_statistics, load_digits
from orchestrator.distributed.runtime import start_local_ray
from orchestrator.gallery import read_shard
from orchestrator.index import load_index
from orchestrator.integrity import trained_outputs
from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import plan_key, train_key
from orchestrator.methods import create_method
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.pipeline.gallery.updater import GalleryUpdater

REPO = Path(__file__).resolve().parents[2]
FILE_SIZES = (120, 1, 150, 100, 168)  # 539 rows in five files, one of a single row


def write_parquet_gallery(folder: Path, labelled: bool = False) -> dict[int, dict[str, str]]:
    """The digits' test images as PNG bytes in five Parquet files (row groups of 32), with an object
    key and a caption per item, and no label unless ``labelled`` (then a ``digit`` column); returns
    row → {"key", "caption"}."""
    digits = load_digits("test")
    order = np.argsort(digits.ids)
    folder.mkdir(parents=True, exist_ok=True)
    expected, start = {}, 0
    for number, size in enumerate(FILE_SIZES):
        rows = range(start, start + size)
        pngs = []
        for row in rows:
            buffer = io.BytesIO()
            Image.fromarray(digits.images[order[row]]).save(buffer, format="PNG")
            pngs.append(buffer.getvalue())
            expected[row] = {"key": f"photos/{digits.ids[order[row]]:05d}.png", "caption": f"digit item {row}"}
        columns = {"image": pngs, "key": [expected[r]["key"] for r in rows],
                   "caption": [expected[r]["caption"] for r in rows]}
        if labelled:
            columns["digit"] = digits.labels[order[list(rows)]].astype(np.int64)
        table = pa.table(columns)
        pq.write_table(table, folder / f"part-{number:03d}.parquet", row_group_size=32)
        start += size
    return expected


def pipeline_config(storage: str, gallery_path: str, items_per_shard: int, batch_size: int = 64) -> dict:
    """pipelines/lifelong.yaml cut to g0-old → g1 (1 epoch each) with the Parquet gallery."""
    config = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    config["storage"] = storage
    config["generations"] = [g for g in config["generations"] if g["name"] in ("g0-old", "g1")]
    config["data"]["scenario"] = "extended_class"
    config["evaluation"] = {"reference": None, "backfill_curves": False}
    for generation in config["generations"]:
        generation["training"] = {**generation["training"], "epochs": 1}
        generation["gate"] = {"action": "force"}  # 1 epoch may fail the gate: not what these tests check
    config["gallery"] = {"name": "photos", "source": "parquet_dataset",
                         "options": {"path": gallery_path, "uri_column": "key", "metadata_columns": ["caption"]},
                         "items_per_shard": items_per_shard,
                         "embedding": {"batch_size": batch_size, "concurrency": 1, "num_cpus": 1}}
    return config


def first_generation(tmp_path: Path, items_per_shard: int, **embedding):
    """The streamed Parquet gallery (539 items), g0-old with untrained, seeded weights and its plan
    committed, ``embedding`` the gallery's embedding settings (2 workers by default); returns
    (config, store, updater)."""
    write_parquet_gallery(tmp_path / "gallery")
    raw = pipeline_config(str(tmp_path / "run"), str(tmp_path / "gallery"), items_per_shard=items_per_shard, batch_size=32)
    raw["generations"] = raw["generations"][:1]
    raw["lineage"] = f"sqlite:///{tmp_path / 'lineage.db'}"
    raw["gallery"]["embedding"].update({"concurrency": 2, **embedding})
    config = PipelineConfig.model_validate(raw)
    store = LineageStore(config.lineage)
    generation = config.generations[0]
    method = create_method("hbct", {"clip": 1.2})
    torch.manual_seed(0)
    model = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=8), 10, range(10))
    uri = f"{config.storage}/generations/{generation.name}"
    card = save_generation(model, method, None, uri, name=generation.name, parent=None)
    store.upsert_generation(generation.name, parent=None, method="hbct")
    store.start_step(train_key(generation.name))
    store.mark_generation_trained(generation.name, uri, card.sha256, step=train_key(generation.name),
                                  step_outputs=trained_outputs(uri, card.sha256))
    updater = GalleryUpdater(config, store, config.storage, channel_statistics(load_digits("train")),
                             lambda: load_digits("test"), lambda line: None)
    key = plan_key(updater.ctx.name, generation.name)
    store.start_step(key)
    updater.planner.plan(generation, key)
    return config, store, updater


def served_rows(store: LineageStore) -> np.ndarray:
    """Every committed shard's source rows (each shard checked against the lineage's hashes)."""
    rows = []
    for shard in store.shards("photos"):
        data = read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)
        assert load_index(shard.index_uri).ntotal == shard.n_items == len(data)
        rows.append(data.rows)
    return np.concatenate(rows)


def serve_untrained(config_file: str) -> None:
    """Serve every generation of the pipeline over its gallery with untrained checkpoints (saved
    once, seeded), skipping committed steps; the process a resume test kills."""
    import ray

    config = PipelineConfig.model_validate(json.loads(Path(config_file).read_text()))
    store = LineageStore(config.lineage)
    for seed, generation in enumerate(config.generations):
        if store.step_status(train_key(generation.name)) == "committed":
            continue
        store.start_step(train_key(generation.name))
        method = create_method("hbct", {"clip": 1.2})
        torch.manual_seed(seed)
        model = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=8), 10, range(10))
        uri = f"{config.storage}/generations/{generation.name}"
        card = save_generation(model, method, None, uri, name=generation.name, parent=generation.parent)
        store.upsert_generation(generation.name, parent=generation.parent, method="hbct")
        store.mark_generation_trained(generation.name, uri, card.sha256, step=train_key(generation.name),
                                      step_outputs=trained_outputs(uri, card.sha256))

    def step(key, action) -> None:
        if store.step_status(key) != "committed":
            store.start_step(key)
            action()

    start_local_ray(num_cpus=2)  # never another Ray on this machine
    updater = GalleryUpdater(config, store, config.storage, channel_statistics(load_digits("train")),
                             lambda: load_digits("test"), lambda line: print(line, flush=True))
    for generation in config.generations:
        key = plan_key(updater.ctx.name, generation.name)
        step(key, functools.partial(updater.planner.plan, generation, key))
        updater.executor.execute(updater.planner.committed_plan(generation.name), generation.name)
    ray.shutdown()


if __name__ == "__main__":
    serve_untrained(sys.argv[1])
