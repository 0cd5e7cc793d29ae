"""An unlabelled gallery of five Parquet files on S3 (moto's server on loopback), served by the CLI:
`orchestrator run` trains g0-old → g1 on the digits, embeds the gallery straight from the bucket,
backfills half of it, and skips the served-gallery report for want of labels; every item ends in
exactly one committed shard with its object key and caption. `orchestrator search` with a folder
of query images then finds each query's own item first, named by its key and caption."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import s3fs
import yaml
from PIL import Image

from orchestrator.gallery import read_shard
from orchestrator.lineage import LineageStore
from streamed_gallery import pipeline_config, write_parquet_gallery

pytestmark = pytest.mark.e2e


def test_an_unlabelled_parquet_gallery_on_s3_runs_from_the_cli_and_is_searched(s3_bucket, tmp_path):
    bucket, endpoint = s3_bucket
    expected = write_parquet_gallery(tmp_path / "gallery")
    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    for part in sorted((tmp_path / "gallery").iterdir()):
        fs.put_file(str(part), f"{bucket}/gallery/{part.name}")
    config = pipeline_config(f"s3://{bucket}/runs/photos", f"s3://{bucket}/gallery/", items_per_shard=100)
    config["lineage"] = f"sqlite:///{tmp_path / 'lineage.db'}"
    pipeline = tmp_path / "photos.yaml"
    pipeline.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}

    run = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(pipeline)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "no labels" in run.stdout  # the served-gallery report is skipped, and says why

    store = LineageStore(config["lineage"])
    os.environ["AWS_ENDPOINT_URL"] = endpoint  # for the reads below (the fixture restores the environment)
    rows, g1_items = [], []
    for shard in store.shards("photos"):
        assert shard.embeddings_uri.startswith(f"s3://{bucket}/runs/photos/galleries/photos/shard-")
        data = read_shard(shard.embeddings_uri, expected_sha256=shard.sha256)
        assert data.attributes.column("uri").to_pylist() == [expected[int(r)]["key"] for r in data.rows]
        rows.append(data.rows)
        if shard.generation == "g1":
            g1_items += [int(r) for r in data.rows[:2]]
    every = np.concatenate(rows)
    assert np.array_equal(np.sort(every), np.arange(539))  # each item in exactly one shard
    assert sum(s.n_items for s in store.shards("photos") if s.generation == "g1") == 269
    assert store.current_deployment().generation == "g1"
    store.close()

    queries = tmp_path / "queries"
    queries.mkdir()
    table = pq.read_table(tmp_path / "gallery" / "part-000.parquet").to_pylist() + \
        pq.read_table(tmp_path / "gallery" / "part-001.parquet").to_pylist() + \
        pq.read_table(tmp_path / "gallery" / "part-002.parquet").to_pylist()
    chosen = [r for r in g1_items if r < len(table)][:3]
    for number, row in enumerate(chosen):
        Image.open(io.BytesIO(table[row]["image"])).save(queries / f"q{number}.png")
    search = subprocess.run([sys.executable, "-m", "orchestrator", "search", str(pipeline), "--queries", str(queries),
                             "-k", "3", "--skip-incompatible", "--json"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert search.returncode == 0, search.stdout[-3000:] + search.stderr[-3000:]
    report = json.loads(search.stdout)
    assert report["queries"] == [str(queries / f"q{n}.png") for n in range(len(chosen))]
    for row, hits in zip(chosen, report["results"]):
        assert hits[0]["uri"] == expected[row]["key"] and hits[0]["caption"] == expected[row]["caption"]
        assert hits[0]["distance"] == pytest.approx(0.0, abs=1e-3)
