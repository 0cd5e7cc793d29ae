"""A gallery from a Ray Data read, end to end (issue 35, item 3's "done when"): the two pipeline
files docs/data.md shows (a Lance dataset through ``read_lance``, a folder of images through
``read_images``) run as shown through ``orchestrator run`` (1 epoch, trained in the driver, the
gate forced), over data generated here from the digits' test split. Then every gallery item is in
exactly one served shard (with its URI, and its caption for Lance), the snapshot is where the docs
say, ``verify`` is clean (the snapshot checked, nothing unreferenced), ``gc`` leaves the snapshot,
and ``orchestrator search`` returns the items' URIs (its ``--evaluate``, which ranks the whole
gallery in memory, refuses a streamed gallery). Reusing the snapshot on a later open is tested
in tests/distributed/test_ray_data_snapshot.py."""
from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from cli_runs import cli, cli_in_process
from orchestrator.config import load_pipeline
from orchestrator.data import load_digits
from orchestrator.gallery import read_shard
from orchestrator.lineage import LineageStore

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
QUICK = ["--set", "ray.num_workers=0", "--set", "generations.0.training.epochs=1",
         "--set", "generations.1.training.epochs=1", "--set", "generations.1.gate.action=force"]


def docs_pipeline(name: str) -> str:
    """The complete pipeline file named ``name`` that docs/data.md shows."""
    text = (REPO / "docs" / "data.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```yaml\n(# docs: complete pipeline file\n.*?)^```", text, re.MULTILINE | re.DOTALL)
    found = [b for b in blocks if re.search(rf"^name: {re.escape(name)}$", b, re.MULTILINE)]
    assert len(found) == 1, f"docs/data.md shows no pipeline {name!r}"
    return found[0]


def png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def served(config) -> tuple[np.ndarray, list[str], list]:
    """(every served item's id, their URIs, their attribute rows), each shard checked against the lineage."""
    store = LineageStore(config.lineage)
    try:
        ids, uris, captions = [], [], []
        for shard in store.shards(config.gallery.name):
            if not shard.n_items:
                continue
            data = read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)
            ids.append(data.ids)
            uris += data.attributes.column("uri").to_pylist()
            captions += (data.attributes.column("caption").to_pylist() if "caption" in data.attributes.column_names
                         else [None] * len(data))
        assert store.current_deployment().generation == "g1"
        return np.concatenate(ids), uris, captions
    finally:
        store.close()


def run_and_check(tmp_path: Path, name: str) -> tuple:
    (tmp_path / "pipeline.yaml").write_text(docs_pipeline(name), encoding="utf-8")
    run = cli("run", "pipeline.yaml", *QUICK, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    config = load_pipeline(str(tmp_path / "pipeline.yaml"), {"storage": str(tmp_path / "runs" / name)})
    snapshots = list((tmp_path / "runs" / name / "galleries" / "photos" / "source").glob("*/manifest.json"))
    assert len(snapshots) == 1
    assert re.search(r"source:photos: read_\w+ snapshot of \d+ items", run.stdout)
    verify = cli_in_process("verify", "pipeline.yaml", cwd=tmp_path)
    assert verify.returncode == 0 and "unreferenced" not in verify.stdout.replace(" 0 unreferenced", ""), verify.stdout
    assert "MISMATCH" not in verify.stdout
    files = sorted(p for p in snapshots[0].parent.iterdir())
    collected = cli_in_process("gc", "pipeline.yaml", cwd=tmp_path)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert sorted(p for p in snapshots[0].parent.iterdir()) == files  # gc leaves the snapshot
    return config, run, snapshots[0]


def test_a_lance_dataset_is_served_end_to_end(tmp_path):
    import lance

    digits = load_digits("test")
    order = np.random.default_rng(0).permutation(len(digits))  # the dataset's order is not the ids'
    table = pa.table({"item_id": digits.ids[order].astype(np.int64),
                      "png": pa.array([png(digits.images[i]) for i in order], pa.binary()),
                      "digit": digits.labels[order].astype(np.int64),
                      "key": [f"photos/{digits.ids[i]:05d}.png" for i in order],
                      "caption": [f"digit {digits.labels[i]}" for i in order]})
    lance.write_dataset(table, str(tmp_path / "photos.lance"), max_rows_per_file=200)
    config, run, manifest = run_and_check(tmp_path, "lance-gallery")

    ids, uris, captions = served(config)
    assert ids.size == len(digits) and np.array_equal(np.sort(ids), np.sort(digits.ids))  # each once
    by_id = {int(i): (f"photos/{i:05d}.png", f"digit {label}") for i, label in zip(digits.ids, digits.labels)}
    assert [(u, c) for u, c in zip(uris, captions)] == [by_id[int(i)] for i in ids]

    search = cli_in_process("search", "pipeline.yaml", "--split", "test", "--limit", "2", "--json",
                            "--serving", "g0", cwd=tmp_path)  # the shards g0 embedded (g1's policy backfills none)
    assert search.returncode == 0, search.stdout + search.stderr
    hits = json.loads(search.stdout)["results"][0]
    assert hits and all(hit["uri"] == by_id[hit["id"]][0] for hit in hits)  # the URIs the Lance rows named
    refused = cli_in_process("search", "pipeline.yaml", "--split", "test", "--evaluate", "--serving", "g0",
                             cwd=tmp_path)
    assert refused.returncode != 0 and "is streamed from ray_data" in refused.stderr


def test_a_folder_of_images_read_by_read_images_is_served_end_to_end(tmp_path):
    digits = load_digits("test")
    folder = tmp_path / "photos"
    for image, label, item in zip(digits.images, digits.labels, digits.ids):
        (folder / f"class-{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"class-{label}" / f"{item:05d}.png")
    paths = sorted(str(p) for p in folder.rglob("*.png"))
    config, _run, _manifest = run_and_check(tmp_path, "folder-gallery")

    ids, uris, _ = served(config)
    assert np.array_equal(np.sort(ids), np.arange(len(digits)))  # each item once; ids: the ranks of the paths
    assert [os.path.realpath(u) for u in uris] == [os.path.realpath(paths[i]) for i in ids]
