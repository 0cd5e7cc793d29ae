"""Gallery sources read a gallery in pieces: row ranges and row sets of a multi-file Parquet dataset
(encoded or pixel-array images, row groups smaller than the reads), image files under a folder,
and an in-memory split — each checked against the images and ids written."""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from orchestrator.data import load_digits
from orchestrator.data.gallery_sources import (
    ImageFilesSource,
    ImageFormat,
    MemorySource,
    ParquetDatasetSource,
    decode_images,
    raw_image_column,
)
from orchestrator.data.registry import open_gallery_source

SIZES = (7, 1, 12, 5)  # rows per file


def png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Four Parquet files (row groups of 3) of random 6×6 images; returns (folder, images (N,6,6,3))."""
    folder = tmp_path_factory.mktemp("gallery")
    images = np.random.default_rng(0).integers(0, 256, (sum(SIZES), 6, 6, 3), dtype=np.uint8)
    start = 0
    for number, size in enumerate(SIZES):
        part = images[start:start + size]
        table = pa.table({"image": [png(im) for im in part], "pixels": [im.reshape(-1).tolist() for im in part],
                          "nested": [im.tolist() for im in part], "key": [f"obj-{start + i}" for i in range(size)],
                          "ident": np.arange(start, start + size, dtype=np.int64) * 10 + 3,
                          "caption": [f"caption {start + i}" for i in range(size)],
                          "label": np.arange(start, start + size, dtype=np.int64) % 3})
        pq.write_table(table, folder / f"part-{number:02d}.parquet", row_group_size=3)
        start += size
    (folder / "README.txt").write_text("not a parquet file")
    return folder, images


def read_all(source, rows) -> pa.Table:
    return pa.concat_tables(list(source.read_rows(np.asarray(rows), block_rows=4)))


def test_a_parquet_dataset_reads_any_rows_across_files_and_row_groups(written):
    folder, images = written
    source = ParquetDatasetSource(str(folder), metadata_columns=["caption"])
    assert source.num_items == sum(SIZES) and not source.has_labels
    assert [f.num_rows for f in source.fragments] == list(SIZES)
    rows = np.array([24, 0, 6, 7, 8, 19, 3])  # across every file, unsorted
    table = read_all(source, rows)
    assert table.column("row").to_pylist() == sorted(rows.tolist())
    assert table.column("id").to_pylist() == sorted(rows.tolist())  # no id column: the row
    assert table.column("label").to_pylist() == [-1] * rows.size
    assert table.column("caption").to_pylist() == [f"caption {r}" for r in sorted(rows.tolist())]
    uris = table.column("uri").to_pylist()
    assert uris[2:4] == [f"{folder}/part-00.parquet#6", f"{folder}/part-01.parquet#0"]  # rows 6 and 7
    np.testing.assert_array_equal(decode_images(table.column("image"), source.image_format, 6), images[np.sort(rows)])


def test_row_ranges_and_row_sets_come_in_blocks_of_the_size_asked(written):
    """A row range starting inside a row group (groups of 3) read in blocks of 2, and a row set
    read in blocks of 4: the rows in order, each block at most the size asked, and a row set's
    filtered rows regrouped into full blocks (all but the last)."""
    folder, images = written
    source = ParquetDatasetSource(str(folder), image_column="pixels", image_shape=[6, 6, 3])
    reader = source.reader(source.fragments[2])  # 12 rows: groups [0, 3) [3, 6) [6, 9) [9, 12)
    blocks = list(reader.blocks(4, 11, None, 2))
    assert [len(b) for b in blocks] == [1, 2, 2, 2]  # batches of 2 from the first group held (row 3), cut to [4, 11)
    first = source.fragments[2].first_row
    assert pa.concat_tables(blocks).column("row").to_pylist() == list(range(first + 4, first + 11))
    np.testing.assert_array_equal(decode_images(pa.concat_tables(blocks).column("image"), source.image_format, 6),
                                  images[first + 4:first + 11])
    keep = np.array([0, 2, 3, 5, 7, 8, 9, 11])
    kept = list(reader.blocks(0, 12, keep, 3))
    assert [len(b) for b in kept] == [3, 3, 2]
    assert pa.concat_tables(kept).column("row").to_pylist() == (keep + first).tolist()


def test_a_sparse_row_set_reads_only_the_row_groups_that_hold_its_rows(written, monkeypatch):
    folder, images = written
    source = ParquetDatasetSource(str(folder), image_column="pixels", image_shape=[6, 6, 3])
    read_groups = []
    iter_batches = pq.ParquetFile.iter_batches
    monkeypatch.setattr(pq.ParquetFile, "iter_batches",
                        lambda self, *args, **kwargs: (read_groups.append(kwargs["row_groups"]),
                                                       iter_batches(self, *args, **kwargs))[1])
    first = source.fragments[2].first_row  # 12 rows: groups [0, 3) [3, 6) [6, 9) [9, 12)
    blocks = list(source.reader(source.fragments[2]).blocks(0, 12, np.array([0, 4, 11]), 2))
    assert read_groups == [[0, 1], [3]]  # the groups holding rows 0 and 4, then the one holding 11
    assert pa.concat_tables(blocks).column("row").to_pylist() == [first, first + 4, first + 11]
    np.testing.assert_array_equal(decode_images(pa.concat_tables(blocks).column("image"), source.image_format, 6),
                                  images[[first, first + 4, first + 11]])


def test_encoded_flat_and_nested_pixel_columns_decode_to_the_same_images(written):
    folder, images = written
    rows = np.arange(sum(SIZES))
    decoded = [decode_images(read_all(source, rows).column("image"), source.image_format, 5)
               for source in (ParquetDatasetSource(str(folder)),
                              ParquetDatasetSource(str(folder), image_column="pixels", image_shape=[6, 6, 3]),
                              ParquetDatasetSource(str(folder), image_column="nested"))]
    expected = np.stack([np.asarray(Image.fromarray(im).resize((5, 5), Image.Resampling.BILINEAR)) for im in images])
    for array in decoded:
        np.testing.assert_array_equal(array, expected)


def test_id_uri_and_label_columns_are_taken_from_the_files(written):
    folder, _ = written
    source = open_gallery_source("parquet_dataset", {"path": str(folder), "id_column": "ident", "uri_column": "key",
                                                     "label_column": "label"})
    table = read_all(source, [1, 9, 24])
    assert table.column("id").to_pylist() == [13, 93, 243]
    assert table.column("uri").to_pylist() == ["obj-1", "obj-9", "obj-24"]
    assert table.column("label").to_pylist() == [1, 0, 0]
    sample = source.labelled_sample(10, image_size=6, seed=3)
    assert len(sample) == 10 and set(sample.labels.tolist()) <= {0, 1, 2}
    assert set(sample.ids.tolist()) <= {10 * r + 3 for r in range(sum(SIZES))}


def test_bad_options_name_the_field_and_value(written, tmp_path):
    folder, _ = written
    with pytest.raises(ValueError, match=r"id_column: column 'nope' is not in .*part-00.parquet"):
        ParquetDatasetSource(str(folder), id_column="nope")
    with pytest.raises(ValueError, match=r"metadata_columns: \['row'\] are reserved"):
        pa_table = pa.table({"image": [b""], "row": [1]})
        pq.write_table(pa_table, tmp_path / "x.parquet")
        ParquetDatasetSource(str(tmp_path / "x.parquet"), metadata_columns=["row"])
    with pytest.raises(FileNotFoundError, match=r"path: no .parquet files at .*empty"):
        (tmp_path / "empty").mkdir()
        ParquetDatasetSource(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="unknown gallery source 'parquet_folder'"):
        open_gallery_source("parquet_folder", {})


def test_image_files_are_read_in_path_order_with_folder_labels(written, tmp_path):
    _, images = written
    for k, image in enumerate(images[:9]):
        folder = tmp_path / "images" / ("cats" if k % 2 else "dogs")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{k:03d}.png")
    source = ImageFilesSource(str(tmp_path / "images"), labels="folder")
    table = read_all(source, np.arange(9))
    uris = table.column("uri").to_pylist()
    assert uris == sorted(uris) and uris[0].endswith("cats/001.png")
    assert table.column("label").to_pylist() == [0] * 4 + [1] * 5  # cats, then dogs
    order = [int(u[-7:-4]) for u in uris]
    np.testing.assert_array_equal(decode_images(table.column("image"), source.image_format, 6), images[order])
    assert source.labelled_sample(100, image_size=6).class_names == ["cats", "dogs"]
    assert ImageFilesSource(str(tmp_path / "images")).labelled_sample(5, image_size=6) is None


def test_an_in_memory_split_reads_rows_in_id_order():
    digits = load_digits("test")
    shuffled = digits.subset(np.random.default_rng(0).permutation(len(digits)))
    source = MemorySource(shuffled, "digits:test")
    table = read_all(source, [5, 0, 538])
    order = np.argsort(digits.ids)
    assert table.column("id").to_pylist() == digits.ids[order][[0, 5, 538]].tolist()
    np.testing.assert_array_equal(decode_images(table.column("image"), source.image_format, 32),
                                  digits.images[order][[0, 5, 538]])
    np.testing.assert_array_equal(source.rows_of(digits.ids[order][[7, 3]]), [7, 3])


def test_raw_pixel_rows_decode_in_one_copy_and_a_short_row_is_named():
    images = np.random.default_rng(0).integers(0, 256, size=(5, 4, 4, 3), dtype=np.uint8)
    column = raw_image_column(images)
    assert column.type == pa.binary() and column.to_pylist()[2] == images[2].tobytes()
    decoded = decode_images(column, ImageFormat("raw", (4, 4, 3)), 4)
    np.testing.assert_array_equal(decoded, images)
    decoded[0, 0, 0, 0] ^= 1  # writable, and not a view of the column
    assert column.to_pylist()[0] == images[0].tobytes()
    resized = decode_images(column, ImageFormat("raw", (4, 4, 3)), 3)
    expected = np.stack([np.asarray(Image.fromarray(im).resize((3, 3), Image.Resampling.BILINEAR)) for im in images])
    np.testing.assert_array_equal(resized, expected)
    short = column.to_pylist()
    short[3] = short[3][:-1]
    with pytest.raises(ValueError, match=r"^image 3 of the batch: 47 bytes, expected 48 for raw pixels of shape \(4, 4, 3\)$"):
        decode_images(short, ImageFormat("raw", (4, 4, 3)), 4)
    # an Arrow column is read through its data buffer: a slice (offset 2) gives its own rows, and a
    # short or a missing row in an Arrow column is named as in a list
    np.testing.assert_array_equal(decode_images(column.slice(2, 3), ImageFormat("raw", (4, 4, 3)), 4), images[2:5])
    with pytest.raises(ValueError, match=r"^image 3 of the batch: 47 bytes, expected 48"):
        decode_images(pa.array(short, pa.binary()), ImageFormat("raw", (4, 4, 3)), 4)
    missing = column.to_pylist()
    missing[1] = None
    with pytest.raises(ValueError, match=r"^image 1 of the batch: no bytes, expected 48"):
        decode_images(pa.chunked_array([pa.array(missing, pa.binary())]), ImageFormat("raw", (4, 4, 3)), 4)
