"""The snapshot of a gallery read by Ray Data (``orchestrator.data.ray_data_read``), written by
Ray Data workers; the driver receives one small row per written file.

``write_snapshot(read, folder)`` runs, as one Ray Data job:

1. ``ray.data.read_<read>(**args)``;
2. a map that brings each block into the project's columns: ``id`` (int64, checked: integers
   without nulls), ``uri`` (string), ``image`` (binary: encoded bytes kept, uint8 arrays stored as
   PNG), ``label`` (int64 ≥ 0, when the read has labels) and the metadata columns;
3. ``sort`` by ``id`` (by ``uri`` for a file read without ids): Ray Data's distributed sort;
4. a map that writes each sorted block as one Parquet file named after its first key (a retried
   task rewrites the same file), refuses a duplicate inside the block, and returns one row:
   the file, its rows, its first and last key, its size.

The driver orders those rows by first key, refuses a key shared by two blocks (the last of one
equal to the first of the next: the rows are sorted, so that is the only place a duplicate across
blocks can be), and writes ``manifest.json`` last (atomically). A folder without a manifest (a
crash before it) is removed and written again.
"""
from __future__ import annotations

import hashlib
import io
import re
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from orchestrator.data.ray_data_read import (
    MANIFEST,
    SNAPSHOT_FORMAT,
    RayDataRead,
    SnapshotError,
    read_manifest,
)
from orchestrator.distributed.data_settings import data_settings
from orchestrator.distributed.task_errors import raised_error
from orchestrator.storage.filesystem import join_uri, open_filesystem, remove, write_json_atomic

_SNAPSHOT_LINE = re.compile(r"SnapshotError: (.+)")


def write_snapshot(read: RayDataRead, folder: str, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write ``read``'s snapshot into ``folder`` (module docstring; Ray must be connected) and
    return its manifest. ``SnapshotError`` (one line) for rows that cannot form a gallery."""
    import ray

    started = time.perf_counter()
    if read_manifest(folder, storage_options) is None:
        remove(folder, recursive=True, missing_ok=True, storage_options=storage_options)  # a partial snapshot
    try:
        with data_settings(enable_progress_bars=False):
            dataset = getattr(ray.data, f"read_{read.read}")(**read.read_kwargs())
            dataset = dataset.map_batches(partial(convention, read=read), batch_format="pyarrow", batch_size=None)
            dataset = dataset.sort(read.sort_key)
            reports = dataset.map_batches(partial(write_block, folder=folder, key=read.sort_key,
                                                  what=_key_name(read), storage_options=dict(storage_options or {})),
                                          batch_format="pyarrow", batch_size=None).take_all()
    except Exception as error:  # a worker's SnapshotError arrives wrapped by Ray: its one line
        if isinstance(error, SnapshotError) and raised_error(error) is error:
            raise  # raised here, in the driver
        line = _snapshot_line(error)
        if line is None:
            raise
        raise SnapshotError(line) from None
    files = sorted(reports, key=lambda r: r["first"])
    for before, after in zip(files, files[1:]):
        if not before["last"] < after["first"]:
            raise SnapshotError(duplicate_message(_key_name(read), after["first"]))
    if not files:
        raise SnapshotError(f"gallery.options: read_{read.read} gave no rows")
    manifest = {"format": SNAPSHOT_FORMAT, "digest": read.digest, "description": read.description(),
                "sort_key": read.sort_key, "num_items": sum(int(f["rows"]) for f in files),
                "files": [{"name": f["file"], "rows": int(f["rows"]), "bytes": int(f["bytes"]),
                           "first": _plain_key(f["first"]), "last": _plain_key(f["last"])} for f in files]}
    write_json_atomic(join_uri(folder, MANIFEST), manifest, storage_options)
    manifest["seconds"] = round(time.perf_counter() - started, 3)  # not in the file: the file is reproducible
    manifest["driver_rows"] = len(reports)
    return manifest


def _key_name(read: RayDataRead) -> tuple[str, str]:
    """(the option naming the snapshot's sort key, that column)."""
    return ("id_column", read.id_column) if read.id_column is not None else ("uri_column", read.uri)


def duplicate_message(what: tuple[str, str], key: Any) -> str:
    """The one line naming a key that two rows share."""
    field, column = what
    return (f"gallery.options.{field}: {'id' if field == 'id_column' else 'path'} {_plain_key(key)!r} appears in more "
            f"than one row of column {column!r}; a gallery's items need unique ids")


def _plain_key(key: Any) -> Any:
    return key.item() if isinstance(key, np.generic) else key


def _snapshot_line(error: BaseException) -> str | None:
    """The one line of the ``SnapshotError`` a worker raised under ``error``: out of Ray's wrappers
    (``raised_error``: each is an instance of SnapshotError too, its text a traceback), then along
    the causes (Ray Data's ``UserCodeException`` holds it as its cause), else the line in the text."""
    seen, todo = [], [raised_error(error)]
    while todo:
        current = todo.pop()
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        if isinstance(current, SnapshotError):
            return str(current)
        todo += [getattr(current, "cause", None), current.__cause__, current.__context__]
    found = _SNAPSHOT_LINE.findall(str(error))
    return found[-1].strip() if found else None


# --------------------------------------------------------------------------- on the workers


def convention(table: pa.Table, read: RayDataRead) -> pa.Table:
    """One block of the read in the project's columns (module docstring, step 2)."""
    names = table.column_names
    wanted = [("image_column", read.image), ("id_column", read.id_column), ("uri_column", read.uri),
              ("label_column", read.label_column), *(("metadata_columns", c) for c in read.metadata_columns)]
    for field, column in wanted:
        if column is not None and column not in names:
            raise SnapshotError(f"gallery.options.{field}: read_{read.read} gives no column {column!r} (its columns: "
                                f"{', '.join(names)})")
    out: dict[str, pa.Array] = {}
    if read.id_column is not None:
        out["id"] = _integers(table.column(read.id_column), "id_column", read.id_column)
    if read.uri is not None:
        out["uri"] = table.column(read.uri).cast(pa.string())
    else:
        out["uri"] = pa.array([f"{read.read}:{i}" for i in out["id"].to_pylist()], type=pa.string())
    if read.uri is not None and out["uri"].null_count:
        raise SnapshotError(f"gallery.options.uri_column: {out['uri'].null_count} row(s) of column {read.uri!r} are null")
    out["image"] = image_bytes(table.column(read.image), read.image)
    if read.label_column is not None:
        labels = _integers(table.column(read.label_column), "label_column", read.label_column)
        if len(labels) and pc.min(labels).as_py() < 0:
            raise SnapshotError(f"gallery.options.label_column: labels must be >= 0, got {pc.min(labels).as_py()}")
        out["label"] = labels
    for name in read.metadata_columns:
        out[name] = table.column(name)
    return pa.table(out)


def _integers(column: pa.ChunkedArray, field: str, name: str) -> pa.ChunkedArray:
    if not pa.types.is_integer(column.type) or column.null_count:
        raise SnapshotError(f"gallery.options.{field}: column {name!r} must hold integers without nulls, got "
                            f"{column.type} with {column.null_count} null(s)")
    return column.cast(pa.int64())


def image_bytes(column: pa.ChunkedArray, name: str) -> pa.Array:
    """An image column → binary: encoded bytes (or a struct's ``bytes``) as they are; uint8
    arrays (Ray's tensor columns, nested lists) as PNG."""
    if column.null_count:
        raise SnapshotError(f"gallery.options.image_column: {column.null_count} row(s) of column {name!r} have no image")
    kind = column.type
    if pa.types.is_struct(kind):
        if kind.get_field_index("bytes") < 0:
            raise SnapshotError(f"gallery.options.image_column: struct column {name!r} has no 'bytes' field")
        return pa.concat_arrays([chunk.field("bytes").cast(pa.binary()) for chunk in column.chunks] or
                                [pa.array([], pa.binary())])
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return column.combine_chunks().cast(pa.binary())
    images = []
    for chunk in column.chunks:
        if isinstance(kind, pa.ExtensionType) and hasattr(chunk, "to_numpy"):
            images += list(chunk.to_numpy(zero_copy_only=False))
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            images += [np.asarray(value) for value in chunk.to_pylist()]
        else:
            raise SnapshotError(f"gallery.options.image_column: column {name!r} has type {kind}; expected encoded "
                                "bytes, struct<bytes> or uint8 arrays")
    return pa.array([_png(np.asarray(image), name) for image in images], type=pa.binary())


def _png(image: np.ndarray, name: str) -> bytes:
    from PIL import Image

    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (3, 4)):
        raise SnapshotError(f"gallery.options.image_column: column {name!r}: an image of shape {image.shape}; "
                            "expected (H, W), (H, W, 1), (H, W, 3) or (H, W, 4)")
    if image.dtype != np.uint8:
        if image.size and (image.min() < 0 or image.max() > 255 or not np.all(np.equal(np.mod(image, 1), 0))):
            raise SnapshotError(f"gallery.options.image_column: column {name!r}: pixel values must be integers "
                                f"0..255, got {image.dtype}")
        image = image.astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def write_block(table: pa.Table, folder: str, key: str, what: tuple[str, str], storage_options: dict[str, Any]) -> pa.Table:
    """Write one sorted block as a Parquet file (module docstring, step 4); its one report row."""
    empty = pa.table({"file": pa.array([], pa.string()), "rows": pa.array([], pa.int64()),
                      "bytes": pa.array([], pa.int64()), "first": pa.array([], table.schema.field(key).type),
                      "last": pa.array([], table.schema.field(key).type)})
    if table.num_rows == 0:
        return empty
    keys = table.column(key).combine_chunks()
    if len(keys) > 1:
        same = pc.equal(keys.slice(1), keys.slice(0, len(keys) - 1))
        if pc.any(same).as_py():
            index = int(np.flatnonzero(same.to_numpy(zero_copy_only=False))[0]) + 1
            raise SnapshotError(duplicate_message(what, keys[index].as_py()))
    first, last = keys[0].as_py(), keys[-1].as_py()
    name = f"part-{hashlib.sha256(repr(first).encode()).hexdigest()[:16]}.parquet"
    fs, path = open_filesystem(join_uri(folder, name), storage_options)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as handle:
        pq.write_table(table, handle, row_group_size=1024)
    size = fs.size(path)
    return pa.table({"file": [name], "rows": [table.num_rows], "bytes": [size],
                     "first": pa.array([first], keys.type), "last": pa.array([last], keys.type)})
