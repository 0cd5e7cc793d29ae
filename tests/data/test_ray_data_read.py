"""A ``ray_data`` gallery's options are checked when the file is loaded, without Ray or torch: a
read the project does not take, a missing id column, a password in the database URL, an argument
the project sets itself are each one line naming the field and the value."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.config import PipelineConfig
from orchestrator.data.ray_data_read import RayDataRead, ReadOptionError, SqlConnection, read_spec

REPO = Path(__file__).resolve().parents[2]
LANCE = {"read": "lance", "args": {"uri": "./photos.lance"}, "id_column": "item_id", "image_column": "png"}


def pipeline(options: dict) -> dict:
    config = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    config["gallery"] = {"name": "photos", "source": "ray_data", "options": options, "items_per_shard": 100}
    return config


def test_a_lance_read_validates():
    gallery = PipelineConfig.model_validate(pipeline(LANCE)).gallery
    assert gallery.source == "ray_data" and gallery.options["read"] == "lance"


@pytest.mark.parametrize("options, line", [
    ({**LANCE, "read": "lancedb"}, "gallery.options.read: not a Ray Data read this project takes; known: parquet, "
                                   "images, binary_files, lance, sql (got \"lancedb\")"),
    ({k: v for k, v in LANCE.items() if k != "id_column"}, "gallery.options.id_column: required for read_lance"),
    ({"read": "sql", "url": "postgresql://reader:hunter2@db/photos", "query": "SELECT 1", "id_column": "id"},
     "gallery.options.url: never a password in the URL: give it in PGPASSWORD or ~/.pgpass (got "
     "\"postgresql://reader:***@db/photos\")"),
    ({"read": "sql", "url": "postgresql://reader@db/photos?password=hunter2", "query": "SELECT 1",
      "id_column": "id"}, "gallery.options.url: never a password in the URL"),
    ({"read": "sql", "url": "mysql://reader@db/photos", "query": "SELECT 1", "id_column": "id"},
     "gallery.options.url: scheme must be one of"),
    ({"read": "sql", "url": "sqlite:///photos.db", "id_column": "id"}, "gallery.options.query: read: sql needs"),
    ({**LANCE, "args": {"uri": "x", "shuffle": "files"}}, "gallery.options.args.shuffle: not an argument read_lance "
                                                          "takes from a file"),
    ({"read": "images", "args": {"paths": "x", "include_paths": False}},
     "gallery.options.args.include_paths: set by the project"),
    ({"read": "images", "args": {}}, "gallery.options.args.paths: read_images needs the data it reads"),
    ({**LANCE, "colour": "red"}, "gallery.options.colour: unknown option of source 'ray_data'"),
    ({**LANCE, "metadata_columns": ["row"]}, "gallery.options.metadata_columns: reserved names"),
    ({**LANCE, "url": "sqlite:///x.db"}, "gallery.options.url: only read: sql takes it"),
])
def test_a_bad_read_is_one_line_naming_the_field_and_value(options, line):
    with pytest.raises(ValueError) as caught:
        PipelineConfig.model_validate(pipeline(options))
    problems = [text for text in str(caught.value).splitlines() if "gallery.options" in text]
    assert len(problems) == 1 and line in problems[0], str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_the_digest_ignores_resource_arguments_and_relative_paths_become_absolute(tmp_path, monkeypatch):
    one = read_spec(LANCE)
    assert read_spec({**LANCE, "args": {"uri": "./photos.lance", "concurrency": 2}}).digest == one.digest
    assert read_spec({**LANCE, "args": {"uri": "./other.lance"}}).digest != one.digest
    assert read_spec({**LANCE, "label_column": "digit"}).digest != one.digest
    monkeypatch.chdir(tmp_path)
    assert one.read_kwargs() == {"uri": str(tmp_path / "photos.lance")}
    files = RayDataRead("images", {"paths": "pics"})
    assert files.read_kwargs() == {"paths": str(tmp_path / "pics"), "include_paths": True}
    assert (files.sort_key, files.uri, files.image) == ("uri", "path", "image")


def test_a_lance_dataset_on_s3_is_read_through_the_storages_endpoint_unless_the_file_says(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    on_s3 = {**LANCE, "args": {"uri": "s3://bucket/photos.lance"}}
    assert read_spec(on_s3).read_kwargs() == {"uri": "s3://bucket/photos.lance", "storage_options": {
        "aws_endpoint": "http://127.0.0.1:9000", "allow_http": "true"}}
    given = {**LANCE, "args": {"uri": "s3://bucket/photos.lance", "storage_options": {"aws_region": "eu-west-1"}}}
    assert read_spec(given).read_kwargs()["storage_options"] == {"aws_region": "eu-west-1"}


def test_sql_reads_a_sqlite_file_read_only_through_a_picklable_factory(tmp_path, monkeypatch):
    import pickle
    import sqlite3

    database = tmp_path / "photos.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE photos (id INTEGER, jpeg BLOB)")
    monkeypatch.chdir(tmp_path)
    read = read_spec({"read": "sql", "url": "sqlite:///photos.db", "query": "SELECT id, jpeg FROM photos",
                      "id_column": "id", "image_column": "jpeg"})
    kwargs = read.read_kwargs()
    assert kwargs["sql"] == "SELECT id, jpeg FROM photos"
    factory = pickle.loads(pickle.dumps(kwargs["connection_factory"]))
    assert factory == SqlConnection(f"sqlite:///{database}")
    connection = factory()
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        connection.execute("INSERT INTO photos VALUES (1, x'00')")
    connection.close()
    with pytest.raises(FileNotFoundError, match="no SQLite database"):
        SqlConnection(f"sqlite:///{tmp_path / 'missing.db'}")()


def test_validating_a_ray_data_file_imports_neither_ray_nor_torch(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(pipeline({"read": "sql", "url": "postgresql://u:pw@db/x", "query": "SELECT 1",
                                            "id_column": "id"})))
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(pipeline(LANCE)))
    code = ("import sys\nfrom orchestrator.config import load_pipeline\n"
            f"load_pipeline({str(good)!r})\n"
            f"try:\n    load_pipeline({str(bad)!r})\nexcept ValueError as error:\n    print(error)\n"
            "print(sorted(m for m in ('ray', 'torch', 'timm', 'torchvision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "gallery.options.url: never a password in the URL" in out and "pw@" not in out
    assert out.strip().splitlines()[-1] == "[]"


def test_a_ray_data_gallery_opens_over_its_snapshot_only():
    from orchestrator.data.registry import open_gallery_source

    with pytest.raises(ValueError, match="opened over its snapshot"):
        open_gallery_source("ray_data", LANCE)
    with pytest.raises(ReadOptionError, match="gallery.options.read"):
        read_spec({"args": {}})
