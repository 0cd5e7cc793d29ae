"""The snapshot of a gallery read by Ray Data (``orchestrator.distributed.ray_data_snapshot``,
opened through ``orchestrator.pipeline.gallery.snapshot``) on a local Ray: the rows come out sorted
by id whatever the read's order, two opens give the same rows and the second writes nothing, the
lineage records the snapshot and refuses another one, a duplicate id is one line naming it (inside
a block or across two), a partial snapshot is replaced, the driver receives one small row per file,
and ``read_sql`` reads a SQLite file and the tests' PostgreSQL server."""
from __future__ import annotations

import io
import json
import sqlite3

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from orchestrator.data import load_digits
from orchestrator.data.ray_data_read import SnapshotError, read_spec, snapshot_folder
from orchestrator.distributed.ray_data_snapshot import write_snapshot
from orchestrator.integrity import IntegrityError
from orchestrator.lineage import LineageStore
from orchestrator.lineage.step_keys import source_key
from orchestrator.pipeline.gallery.snapshot import check_snapshot, open_snapshot

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("local_ray")]


def png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def digits_lance(tmp_path_factory):
    """The digits' test split as a Lance dataset of three fragments, rows in a shuffled order."""
    import lance

    digits = load_digits("test")
    order = np.random.default_rng(1).permutation(len(digits))
    path = tmp_path_factory.mktemp("lance") / "digits.lance"
    lance.write_dataset(pa.table({"item": digits.ids[order].astype(np.int64),
                                  "png": pa.array([png(digits.images[i]) for i in order], pa.binary()),
                                  "digit": digits.labels[order].astype(np.int64)}), str(path), max_rows_per_file=200)
    return str(path), digits


def test_a_lance_snapshot_is_sorted_by_id_stable_and_recorded(tmp_path, digits_lance):
    path, digits = digits_lance
    options = {"read": "lance", "args": {"uri": path}, "id_column": "item", "image_column": "png",
               "label_column": "digit"}
    store = LineageStore(f"sqlite:///{tmp_path / 'lineage.db'}", storage=str(tmp_path))
    root = str(tmp_path / "galleries" / "photos")
    lines, connected = [], []
    source = open_snapshot(store, "photos", root, options, lambda: connected.append(1), lines.append)
    manifest = source.manifest
    assert connected and lines and "snapshot of 539 items" in lines[0]
    assert source.written["driver_rows"] == len(manifest["files"]) <= 8  # what the driver received: a row per file
    assert source.num_items == len(digits) and source.has_labels
    first = pa.concat_tables(source.read_rows(np.arange(source.num_items)))
    ids = first.column("id").to_numpy()
    assert np.array_equal(ids, np.sort(digits.ids))  # row r: the r-th smallest id
    labels = dict(zip(digits.ids.tolist(), digits.labels.tolist()))
    assert first.column("label").to_pylist() == [labels[i] for i in ids.tolist()]
    assert first.column("uri").to_pylist()[:2] == [f"lance:{ids[0]}", f"lance:{ids[1]}"]
    sample = source.labelled_sample(50, 16)
    assert sample.images.shape == (50, 16, 16, 3)

    folder = snapshot_folder(root, read_spec(options))
    written = {p.name: p.stat().st_mtime_ns for p in (tmp_path / folder).iterdir()}
    again = open_snapshot(store, "photos", root, options, lambda: pytest.fail("Ray needed again"), lines.append)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / folder).iterdir()} == written and len(lines) == 1
    assert again.written is None
    second = pa.concat_tables(again.read_rows(np.arange(again.num_items)))
    assert second.equals(first)  # the same rows, in the same order
    outputs = store.committed_outputs(source_key("photos"))
    check_snapshot(outputs)
    assert outputs["num_items"] == 539 and len(outputs["files"]) == len(manifest["files"])

    with pytest.raises(ValueError, match="gallery.options: the read changed since gallery 'photos' was first served"):
        open_snapshot(store, "photos", root, {**options, "label_column": None}, lambda: None)
    (tmp_path / folder / "manifest.json").write_text(json.dumps({**json.loads(
        (tmp_path / folder / "manifest.json").read_text()), "num_items": 1}))
    with pytest.raises(IntegrityError, match="not the one the lineage recorded"):
        open_snapshot(store, "photos", root, options, lambda: None)
    with pytest.raises(IntegrityError, match="snapshot manifest changed"):
        check_snapshot(outputs)


@pytest.mark.parametrize("stage_errors", ["wrapped", "original"])
def test_a_duplicate_id_is_one_line_naming_it(tmp_path, digits_lance, monkeypatch, stage_errors):
    """Also under a driver's ``DataContext`` that raises a stage's error as itself (a user's program
    may set it; a gallery step sets it while it runs, ``gallery_step.STEP_SETTINGS``), which Ray
    wraps in a ``RayTaskError`` that is a ``SnapshotError`` too, its text Ray's traceback: seen
    failing so, in a suite whose lane ran a gallery step before the step's settings were scoped."""
    import lance
    import ray.data

    monkeypatch.setattr(ray.data.DataContext.get_current(), "raise_original_map_exception",
                        stage_errors == "original")
    for where, ids in [("in one block", [5, 1, 2, 5, 3]), ("across blocks", list(range(300)) + [299])]:
        path = tmp_path / f"dup-{len(ids)}.lance"
        lance.write_dataset(pa.table({"item": pa.array(ids, pa.int64()), "png": [png(np.zeros((4, 4), np.uint8))] * len(ids)}),
                            str(path), max_rows_per_file=100)
        read = read_spec({"read": "lance", "args": {"uri": str(path)}, "id_column": "item", "image_column": "png"})
        with pytest.raises(SnapshotError) as caught:
            write_snapshot(read, str(tmp_path / "snap" / read.digest))
        duplicate = 5 if len(ids) == 5 else 299
        assert str(caught.value) == (f"gallery.options.id_column: id {duplicate} appears in more than one row of column "
                                     "'item'; a gallery's items need unique ids"), where
        assert not (tmp_path / "snap" / read.digest / "manifest.json").exists()

    path = tmp_path / "floats.lance"
    lance.write_dataset(pa.table({"item": [1.5, 2.5], "png": [b"x", b"y"]}), str(path))
    read = read_spec({"read": "lance", "args": {"uri": str(path)}, "id_column": "item", "image_column": "png"})
    with pytest.raises(SnapshotError, match="gallery.options.id_column: column 'item' must hold integers"):
        write_snapshot(read, str(tmp_path / "floats"))


def test_a_partial_snapshot_is_replaced_and_read_images_gives_path_ranks(tmp_path):
    digits = load_digits("test")
    for k in range(30):
        (tmp_path / "photos" / str(digits.labels[k])).mkdir(parents=True, exist_ok=True)
        Image.fromarray(digits.images[k]).save(tmp_path / "photos" / str(digits.labels[k]) / f"{digits.ids[k]:05d}.png")
    read = read_spec({"read": "images", "args": {"paths": str(tmp_path / "photos")}})
    folder = tmp_path / "galleries" / "photos" / "source" / read.digest
    folder.mkdir(parents=True)
    (folder / "part-left-by-a-crash.parquet").write_bytes(b"partial")
    manifest = write_snapshot(read, str(folder))
    assert not (folder / "part-left-by-a-crash.parquet").exists() and manifest["num_items"] == 30
    store = LineageStore(f"sqlite:///{tmp_path / 'lineage.db'}", storage=str(tmp_path))
    source = open_snapshot(store, "photos", str(tmp_path / "galleries" / "photos"),
                           {"read": "images", "args": {"paths": str(tmp_path / "photos")}}, lambda: None)
    table = pa.concat_tables(source.read_rows(np.arange(30)))
    paths = sorted(str(p) for p in (tmp_path / "photos").rglob("*.png"))
    assert table.column("uri").to_pylist() == paths and table.column("id").to_pylist() == list(range(30))
    decoded = source.labelled_sample(30, 8) if source.has_labels else None
    assert decoded is None  # no label column: an unlabelled gallery
    from orchestrator.data.gallery_sources import decode_images

    pixels = decode_images(table.column("image"), source.image_format, digits.images.shape[1])
    originals = {f"{i:05d}.png": image for i, image in zip(digits.ids[:30], digits.images[:30])}
    assert all(np.array_equal(p, originals[u.rsplit("/", 1)[1]]) for p, u in zip(pixels, paths))  # lossless


def test_read_sql_from_sqlite_and_postgresql(tmp_path, postgres_server):
    digits = load_digits("test")
    rows = [(int(i), png(image), int(label)) for i, image, label in zip(digits.ids[:40], digits.images[:40],
                                                                        digits.labels[:40])][::-1]
    database = tmp_path / "photos.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE photos (id INTEGER, jpeg BLOB, label INTEGER)")
        connection.executemany("INSERT INTO photos VALUES (?, ?, ?)", rows)
    import psycopg

    url = postgres_server.new_database()
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as connection:
        connection.execute("CREATE TABLE photos (id BIGINT, jpeg BYTEA, label BIGINT)")
        with connection.cursor() as cursor:
            cursor.executemany("INSERT INTO photos VALUES (%s, %s, %s)", rows)
    for name, read_url in [("sqlite", f"sqlite:///{database}"), ("postgresql", url)]:
        read = read_spec({"read": "sql", "url": read_url, "query": "SELECT id, jpeg, label FROM photos WHERE id % 2 = 0",
                          "id_column": "id", "image_column": "jpeg", "label_column": "label"})
        store = LineageStore(f"sqlite:///{tmp_path / f'{name}.db'}", storage=str(tmp_path / name))
        source = open_snapshot(store, "photos", str(tmp_path / name / "galleries" / "photos"),
                               {"read": "sql", "url": read_url, "query": read.query, "id_column": "id",
                                "image_column": "jpeg", "label_column": "label"}, lambda: None)
        table = pa.concat_tables(source.read_rows(np.arange(source.num_items)))
        expected = sorted(i for i, _, _ in rows if i % 2 == 0)
        assert table.column("id").to_pylist() == expected, name
        assert table.column("uri").to_pylist()[0] == f"sql:{expected[0]}"
