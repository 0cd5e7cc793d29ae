"""``gallery.store`` as the pipeline file gives it: each mistake refused in one line naming the
field, when the file is validated (before anything runs)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.config.gallery import GallerySpec
from orchestrator.config.loading import load_pipeline
from orchestrator.config.problems import PipelineConfigError

REPO = Path(__file__).resolve().parents[2]


def refusal(tmp_path: Path, **gallery) -> str:
    config = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    config["gallery"].update(gallery)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    with pytest.raises(PipelineConfigError) as caught:
        load_pipeline(path)
    return str(caught.value)


def test_the_default_store_is_the_shard_files():
    assert GallerySpec().store.kind == "files"
    spec = GallerySpec(store={"kind": "pgvector", "url": "postgresql://orchestrator@db:5432/search", "index": "hnsw",
                              "index_options": {"m": 16, "ef_search": 80}})
    assert (spec.store.kind, spec.store.index) == ("pgvector", "hnsw")
    assert GallerySpec(store={"kind": "lance", "index": "ivf_pq"}).store.path is None
    binary = GallerySpec(index="binary_two_stage", index_options={"rerank": "float"},
                         store={"kind": "pgvector", "url": "postgresql://me@db/s"})  # pgvector's bit type
    assert (binary.index, binary.store.kind) == ("binary_two_stage", "pgvector")


@pytest.mark.parametrize("gallery,expected", [
    ({"store": {"kind": "pgvector", "url": "postgresql://me:hunter2@db/search"}}, "never a password in the URL"),
    ({"store": {"kind": "pgvector", "url": "postgresql://me@db/search?password=hunter2"}}, "never a password"),
    ({"store": {"kind": "pgvector"}}, "needs the database's URL"),
    ({"store": {"kind": "pgvector", "url": "mysql://me@db/search"}}, "a PostgreSQL URL"),
    ({"store": {"kind": "milvus"}}, "must be one of files, pgvector, lance"),
    ({"store": {"kind": "lance", "index": "ivfflat"}}, "a lance store builds exact, ivf_pq, hnsw"),
    ({"store": {"kind": "pgvector", "url": "postgresql://me@db/s", "index": "hnsw", "index_options": {"lists": 4}}},
     "is not an option of index 'hnsw'"),
    ({"store": {"kind": "lance", "url": "postgresql://me@db/s"}}, "only a pgvector store takes a url"),
    ({"index": "pq", "store": {"kind": "pgvector", "url": "postgresql://me@db/s"}}, "searched in shard files only"),
    ({"index": "binary_ivf", "store": {"kind": "pgvector", "url": "postgresql://me@db/s"}},
     "store.index ivfflat or hnsw (pgvector's own index over the bit column)"),
    ({"index": "binary", "store": {"kind": "lance"}}, "a lance store has no Hamming search of bit codes"),
    ({"index": "hnsw", "store": {"kind": "lance"}}, "searched in shard files only"),
])
def test_a_wrong_store_is_refused_naming_the_field(tmp_path, gallery, expected):
    message = refusal(tmp_path, **gallery)
    assert expected in message and "gallery." in message and "\n" not in message
    assert "hunter2" not in message
