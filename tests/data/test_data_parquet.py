"""Parquet source: encoded image bytes, HuggingFace structs and metadata, raw arrays, fsspec URLs."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from orchestrator.data import load_parquet, load_source

RNG = np.random.default_rng(0)
PIXELS = RNG.integers(0, 256, (4, 6, 5, 3), dtype=np.uint8)  # N, H, W, C
LABELS = [2, 0, 1, 2]


def png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def write(path: Path, columns: dict, metadata: dict | None = None) -> Path:
    table = pa.table(columns)
    if metadata:
        table = table.replace_schema_metadata(metadata)
    pq.write_table(table, path)
    return path


def test_png_bytes_with_huggingface_class_names(tmp_path):
    features = {"image": {"_type": "Image"}, "label": {"names": ["cat", "dog", "eel"], "_type": "ClassLabel"}}
    path = write(
        tmp_path / "png.parquet",
        {"image": pa.array([png(p) for p in PIXELS], pa.binary()), "label": pa.array(LABELS, pa.int64())},
        {b"huggingface": json.dumps({"info": {"features": features}}).encode()},
    )
    data = load_parquet(path)
    np.testing.assert_array_equal(data.images, PIXELS)
    np.testing.assert_array_equal(data.labels, LABELS)
    np.testing.assert_array_equal(data.ids, np.arange(4))
    assert data.class_names == ["cat", "dog", "eel"]


def test_huggingface_image_struct_and_id_column_through_file_url(tmp_path):
    structs = [{"bytes": png(p), "path": f"{i}.png"} for i, p in enumerate(PIXELS)]
    path = write(
        tmp_path / "hf.parquet",
        {"img": pa.array(structs), "y": pa.array(LABELS, pa.int32()), "key": pa.array([40, 10, 30, 20], pa.int64())},
    )
    data = load_source("parquet", path_or_url=f"file://{path}", image_column="img", label_column="y", id_column="key")
    np.testing.assert_array_equal(data.images, PIXELS)
    np.testing.assert_array_equal(data.ids, [40, 10, 30, 20])
    assert data.class_names == ["0", "1", "2"]


def test_flat_arrays_need_and_use_image_shape(tmp_path):
    flat = pa.array([p.reshape(-1).tolist() for p in PIXELS], pa.list_(pa.uint8()))
    path = write(tmp_path / "flat.parquet", {"image": flat, "label": pa.array(LABELS)})
    data = load_parquet(path, image_shape=(6, 5, 3), class_names=["a", "b", "c"])
    np.testing.assert_array_equal(data.images, PIXELS)
    assert data.class_names == ["a", "b", "c"]
    with pytest.raises(ValueError, match="image_shape"):
        load_parquet(path)
    with pytest.raises(ValueError, match="image_shape"):
        load_parquet(path, image_shape=(5, 6, 2))


def test_fixed_size_list_grayscale_is_replicated(tmp_path):
    gray = PIXELS[..., 0]
    column = pa.array([g.reshape(-1).tolist() for g in gray], pa.list_(pa.uint8(), 30))
    path = write(tmp_path / "gray.parquet", {"image": column, "label": pa.array(LABELS)})
    data = load_parquet(path, image_shape=(6, 5))
    np.testing.assert_array_equal(data.images, np.repeat(gray[..., None], 3, axis=-1))


def test_nested_lists_and_string_labels(tmp_path):
    nested = pa.array([p.tolist() for p in PIXELS], pa.list_(pa.list_(pa.list_(pa.int16()))))
    names = ["zebra", "ant", "zebra", "moth"]
    path = write(tmp_path / "nested.parquet", {"image": nested, "label": pa.array(names)})
    data = load_parquet(path)
    np.testing.assert_array_equal(data.images, PIXELS)
    assert data.class_names == ["ant", "moth", "zebra"]
    np.testing.assert_array_equal(data.labels, [2, 0, 2, 1])


def test_bad_columns_and_values(tmp_path):
    path = write(tmp_path / "x.parquet", {"image": pa.array([[1, 2, 300]]), "label": pa.array([0])})
    with pytest.raises(ValueError, match="0..255"):
        load_parquet(path, image_shape=(1, 1, 3))
    with pytest.raises(ValueError, match="image_size"):
        load_parquet(path, image_size=0)
    with pytest.raises(ValueError, match=r"\['pixels'\] not found"):
        load_parquet(path, image_column="pixels")
    ragged_column = pa.array([[1, 2, 3], [4, 5, 6, 7, 8, 9]])
    ragged = write(tmp_path / "r.parquet", {"image": ragged_column, "label": pa.array([0, 1])})
    with pytest.raises(ValueError, match="differ in length"):
        load_parquet(ragged, image_shape=(1, 1, 3))
    dup = write(
        tmp_path / "d.parquet",
        {"image": pa.array([png(PIXELS[0])] * 2), "label": pa.array([0, 1]), "k": pa.array([5, 5])},
    )
    with pytest.raises(ValueError, match="ids must be unique"):
        load_parquet(dup, id_column="k")
    floats = write(tmp_path / "f.parquet", {"image": pa.array([0.5]), "label": pa.array([0])})
    with pytest.raises(ValueError, match="unsupported image column type"):
        load_parquet(floats)
