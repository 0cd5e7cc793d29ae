"""Gallery sources: the items of a served gallery, read from storage in bounded pieces.

A gallery can be far larger than one machine's memory, so a source never loads it whole. It is
an ordered list of *fragments* (files, or chunks of a file listing); item ``r`` of the gallery is
row ``r`` of the concatenated fragments (the *row*), and readers return any row range of one
fragment as Arrow tables of at most ``block_rows`` rows. Nothing here imports Ray: the Ray Data
datasource (``orchestrator.distributed.gallery_read``) runs these readers inside read tasks.

Kinds:
- ``parquet_dataset``: a Parquet file or a directory/prefix of many (``*.parquet``, sorted by
  path), local or ``s3://``; images as encoded bytes (PNG/JPEG…, or a struct with a ``bytes``
  field) or pixel arrays; optional id, URI, label and metadata columns. Row counts come from the
  files' footers, so listing the dataset reads no image.
- ``image_files``: image files under a directory/prefix (sorted by path, recursive), local or
  ``s3://``; the label is the first folder below the root when ``labels: folder``.
- ``memory``: a ``LabeledImages`` loaded by one of the data sources (the digits, CIFAR…),
  rows sorted by id.

Every block has the columns ``row`` (int64, the gallery row), ``id`` (int64), ``uri`` (string:
the object key or ``file#row``), ``label`` (int64, −1 when the gallery has no labels), ``image``
(binary: encoded bytes, or raw uint8 pixels for ``image_format`` ``raw``) and the metadata
columns the user names. Ids: the id column, else the row (stable while the files do not change).

The streamed kinds by name (``STREAMED_SOURCES``, ``open_gallery_source``): ``orchestrator.data.registry``.
"""
from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from orchestrator.data.images import LabeledImages
from orchestrator.data.sources import IMAGE_EXTENSIONS, _array_images, _is_list

RESERVED_COLUMNS = ("row", "id", "uri", "label", "image", "entry", "embedding", "uncertainty", "generation")
_FILES_PER_FRAGMENT = 256


@dataclass(frozen=True)
class Fragment:
    """A piece of the gallery: ``num_rows`` rows starting at gallery row ``first_row``."""

    key: str
    first_row: int
    num_rows: int


@dataclass(frozen=True)
class ImageFormat:
    """How the ``image`` column is stored: ``encoded`` (PNG/JPEG… bytes) or ``raw`` uint8 (H, W, 3)."""

    kind: str
    shape: tuple[int, int, int] | None = None


def decode_images(column: Sequence[bytes] | pa.Array, image_format: ImageFormat, image_size: int) -> np.ndarray:
    """An ``image`` column of n rows → uint8 (n, image_size, image_size, 3) (RGB, bilinear resize)."""
    arrow = isinstance(column, (pa.Array, pa.ChunkedArray))
    if image_format.kind == "raw":
        rows = _equal_binary_rows(column, int(np.prod(image_format.shape))) if arrow else None
        if rows is None:  # a Python sequence, nulls or a wrong length: row by row, naming the row
            rows = _raw_rows(column.to_pylist() if arrow else list(column), image_format.shape)
        return _raw_images(rows.reshape(len(rows), *image_format.shape), image_size)
    values = column.to_pylist() if arrow else list(column)
    out = np.empty((len(values), image_size, image_size, 3), dtype=np.uint8)
    for i, value in enumerate(values):
        try:
            with Image.open(io.BytesIO(value)) as image:
                rgb = image.convert("RGB")
        except (OSError, Image.DecompressionBombError) as err:
            raise ValueError(f"image {i} of the batch: cannot decode ({err})") from err
        out[i] = _resized(rgb, image_size)
    return out


def _equal_binary_rows(column: pa.Array | pa.ChunkedArray, size: int) -> np.ndarray | None:
    """A binary column whose every row holds ``size`` bytes → uint8 (n, size), a view of its data
    buffer (no Python object per row); None when a row is null or of another length."""
    if isinstance(column, pa.ChunkedArray):  # one chunk (a block's slice) read in place: combining copies
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if not pa.types.is_binary(column.type) or column.null_count:
        return None
    if not len(column):
        return np.empty((0, size), dtype=np.uint8)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[column.offset:column.offset + len(column) + 1]
    if not (np.diff(offsets) == size).all():
        return None
    return np.frombuffer(column.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]].reshape(len(column), size)


def _raw_rows(values: Sequence[bytes], shape: tuple[int, int, int]) -> np.ndarray:
    """Rows of raw (H, W, 3) pixels as Python bytes → uint8 (n, H·W·3); ValueError naming the first
    row of another length."""
    size = int(np.prod(shape))
    wrong = next((i for i, value in enumerate(values) if value is None or len(value) != size), None)
    if wrong is not None:
        got = "no bytes" if values[wrong] is None else f"{len(values[wrong])} bytes"
        raise ValueError(f"image {wrong} of the batch: {got}, expected {size} for raw pixels of shape {tuple(shape)}")
    return np.frombuffer(b"".join(values), dtype=np.uint8).reshape(len(values), size)


def _raw_images(pixels: np.ndarray, image_size: int) -> np.ndarray:
    """uint8 (n, H, W, 3) → a writable uint8 (n, image_size, image_size, 3): one copy, resized
    image by image only when (H, W) is not (image_size, image_size)."""
    if tuple(pixels.shape[1:3]) == (image_size, image_size):
        return pixels.copy()  # writable, as the model input wants it
    out = np.empty((len(pixels), image_size, image_size, 3), dtype=np.uint8)
    for i, image in enumerate(pixels):
        out[i] = _resized(Image.fromarray(image), image_size)
    return out


def _resized(rgb: Image.Image, image_size: int) -> np.ndarray:
    """An RGB image as uint8 (image_size, image_size, 3), bilinear when its size differs."""
    if rgb.size != (image_size, image_size):
        rgb = rgb.resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8)


def raw_image_column(pixels: np.ndarray) -> pa.Array:
    """uint8 images (n, H, W, 3) → a binary column of their raw bytes, built from one buffer."""
    flat = np.ascontiguousarray(pixels, dtype=np.uint8).reshape(len(pixels), -1)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(flat.shape[1]), len(flat),
                                                [None, pa.py_buffer(flat)]).cast(pa.binary())


class GallerySource:
    """Base of the gallery sources (module docstring): fragments, readers, a labelled sample."""

    kind = "?"
    has_labels = False
    image_format = ImageFormat("encoded")
    metadata_columns: tuple[str, ...] = ()

    def __init__(self, description: str, fragments: Sequence[Fragment]):
        self.description = description
        self.fragments = tuple(fragments)
        self.num_items = sum(f.num_rows for f in self.fragments)
        if self.num_items == 0:
            raise ValueError(f"{description}: the gallery source holds no items")

    def reader(self, fragment: Fragment) -> FragmentReader:
        raise NotImplementedError

    def pieces(self, start: int, stop: int) -> list[tuple[Fragment, int, int]]:
        """Gallery rows [start, stop) as (fragment, local start, local stop) pieces, in row order."""
        out = []
        for fragment in self.fragments:
            lo, hi = max(start, fragment.first_row), min(stop, fragment.first_row + fragment.num_rows)
            if lo < hi:
                out.append((fragment, lo - fragment.first_row, hi - fragment.first_row))
        return out

    def read_rows(self, rows: np.ndarray, block_rows: int = 4096) -> Iterator[pa.Table]:
        """Blocks holding exactly the gallery rows ``rows`` (any order in; row order out)."""
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        if rows.size and (rows[0] < 0 or rows[-1] >= self.num_items):
            raise ValueError(f"{self.description}: rows outside [0, {self.num_items})")
        for fragment in self.fragments:
            lo, hi = np.searchsorted(rows, [fragment.first_row, fragment.first_row + fragment.num_rows])
            if lo < hi:
                local = rows[lo:hi] - fragment.first_row
                yield from self.reader(fragment).blocks(int(local[0]), int(local[-1]) + 1, local, block_rows)

    def labelled_sample(self, max_items: int, image_size: int, seed: int = 0) -> LabeledImages | None:
        """At most ``max_items`` items (a seeded uniform sample of rows, all when fewer) decoded to
        ``image_size``, or None when the gallery has no labels."""
        if not self.has_labels:
            return None
        rows = np.arange(self.num_items, dtype=np.int64)
        if self.num_items > max_items:
            rows = np.sort(np.random.default_rng(seed).choice(self.num_items, size=max_items, replace=False))
        blocks = list(self.read_rows(rows))
        table = pa.concat_tables(blocks)
        labels = table.column("label").to_numpy().astype(np.int64)
        names = self.class_names(int(labels.max()) + 1 if labels.size else 0)
        return LabeledImages(decode_images(table.column("image"), self.image_format, image_size), labels,
                             table.column("id").to_numpy().astype(np.int64), names)

    def class_names(self, count: int) -> list[str]:
        return [str(i) for i in range(count)]


class FragmentReader:
    """Reads row ranges of one fragment (small and picklable: it travels to Ray read tasks)."""

    def blocks(self, start: int, stop: int, keep: np.ndarray | None = None, block_rows: int = 4096) -> Iterator[pa.Table]:
        """Tables of at most ``block_rows`` rows covering local rows [start, stop), restricted to
        the sorted local rows ``keep`` when given."""
        raise NotImplementedError


# --------------------------------------------------------------------------- Parquet datasets


def _list_files(path: str, suffixes: tuple[str, ...], storage_options: dict[str, Any] | None) -> tuple[Any, list[str]]:
    """(file system, sorted full paths of the files under ``path`` ending in ``suffixes``; or ``path``
    itself when it is such a file). FileNotFoundError naming ``path`` when nothing is there."""
    fs, root = fsspec.core.url_to_fs(str(path), **(storage_options or {}))
    if fs.isfile(root):
        files = [root]
    else:
        files = sorted(p for p in fs.find(root) if p.lower().endswith(suffixes))
    if not files:
        raise FileNotFoundError(f"path: no {'/'.join(suffixes)} files at {path}")
    return fs, files


def _full_uri(fs: Any, path: str) -> str:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return path if protocol in ("file", "local") else f"{protocol}://{path}"


class ParquetDatasetSource(GallerySource):
    """A Parquet file or a directory/prefix of Parquet files (module docstring).

    path:             local path or ``s3://bucket/prefix``.
    image_column:     encoded bytes, struct<bytes>, or pixel lists (flat lists need ``image_shape``).
    id_column:        unique integer ids (default: the row).
    uri_column:       a string column naming each item's source (default ``<file>#<row in file>``).
    label_column:     integer class labels ≥ 0 (default: none, an unlabelled gallery).
    metadata_columns: further columns carried into the shard files and search results.
    """

    kind = "parquet_dataset"

    def __init__(self, path: str, image_column: str = "image", id_column: str | None = None,
                 uri_column: str | None = None, label_column: str | None = None,
                 metadata_columns: Sequence[str] = (), image_shape: Sequence[int] | None = None,
                 storage_options: dict[str, Any] | None = None):
        fs, files = _list_files(path, (".parquet",), storage_options)
        fragments, schema = [], None
        for file in files:
            with fs.open(file, "rb") as handle:
                parquet = pq.ParquetFile(handle)
                schema = schema or parquet.schema_arrow
                fragments.append(Fragment(_full_uri(fs, file), sum(f.num_rows for f in fragments), parquet.metadata.num_rows))
        wanted = {"image_column": image_column, "id_column": id_column, "uri_column": uri_column,
                  "label_column": label_column}
        for field, column in [*wanted.items(), *(("metadata_columns", c) for c in metadata_columns)]:
            if column is not None and column not in schema.names:
                raise ValueError(f"{field}: column {column!r} is not in {files[0]} (columns: {', '.join(schema.names)})")
        clashes = [c for c in metadata_columns if c in RESERVED_COLUMNS]
        if clashes:
            raise ValueError(f"metadata_columns: {clashes} are reserved names ({', '.join(RESERVED_COLUMNS)})")
        self.columns = dict(wanted, metadata=tuple(metadata_columns),
                            image_shape=None if image_shape is None else tuple(int(d) for d in image_shape))
        self.metadata_columns = tuple(metadata_columns)
        self.has_labels = label_column is not None
        self.storage_options = dict(storage_options or {})
        self.image_format = _parquet_image_format(schema.field(image_column).type, image_column, image_shape)
        super().__init__(f"parquet_dataset {path}", fragments)
        if self.image_format.kind == "raw" and self.image_format.shape is None:  # nested lists: row 0's shape
            with fs.open(files[0], "rb") as handle:
                first = pq.ParquetFile(handle).read_row_group(0, columns=[image_column]).slice(0, 1)
            shape = _array_images(first.column(image_column).combine_chunks(), image_column, None).shape[1:]
            self.image_format = ImageFormat("raw", tuple(int(s) for s in shape))

    def reader(self, fragment: Fragment) -> FragmentReader:
        return _ParquetReader(fragment, self.columns, self.image_format, self.storage_options)


def _parquet_image_format(kind: pa.DataType, name: str, image_shape: Sequence[int] | None) -> ImageFormat:
    if pa.types.is_struct(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return ImageFormat("encoded")
    if _is_list(kind):
        shape = tuple(int(s) for s in image_shape) if image_shape is not None else None
        if shape is None:  # nested lists carry their shape; found on the first block
            return ImageFormat("raw", None)
        return ImageFormat("raw", shape if len(shape) == 3 else (*shape, 3))
    raise ValueError(f"image_column: {name!r} has type {kind}; expected bytes, struct<bytes> or lists of uint8")


@dataclass(frozen=True)
class _ParquetReader(FragmentReader):
    fragment: Fragment
    columns: dict[str, Any]
    image_format: ImageFormat
    storage_options: dict[str, Any]

    def blocks(self, start, stop, keep=None, block_rows=4096):
        pieces = self._row_pieces(start, stop, keep, block_rows)
        if keep is not None:  # filtered batches: regrouped into blocks of block_rows again
            pieces = _regrouped(pieces, block_rows)
        for table, local in pieces:
            yield self._assemble(table, local)

    def _row_pieces(self, start: int, stop: int, keep: np.ndarray | None,
                    batch_rows: int) -> Iterator[tuple[pa.Table, np.ndarray]]:
        """(rows, their local rows) of [start, stop) (those in ``keep`` when given), read in
        batches of ``batch_rows`` from the row groups that hold them (a group holding no row of
        ``keep`` is not read): one whole group at a time (4,096 rows of 3 KB images in
        benchmarks/gallery_scale.py) cost 1.3-1.6x the CPU per row."""
        fs, path = fsspec.core.url_to_fs(self.fragment.key, **self.storage_options)
        wanted = list(dict.fromkeys(c for c in (self.columns["image_column"], self.columns["id_column"],
                                                self.columns["uri_column"], self.columns["label_column"],
                                                *self.columns["metadata"]) if c is not None))
        with fs.open(path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            bounds = np.cumsum([0] + [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)])
            lows, highs = np.maximum(bounds[:-1], start), np.minimum(bounds[1:], stop)
            held = lows < highs
            if keep is not None:
                held &= np.searchsorted(keep, lows) < np.searchsorted(keep, highs)
            for run in _consecutive_runs(np.flatnonzero(held).tolist()):
                first = int(bounds[run[0]])  # the run's batches follow one another from its first row
                for batch in parquet.iter_batches(batch_rows, row_groups=run, columns=wanted):
                    lo, hi = max(start, first), min(stop, first + batch.num_rows)
                    if lo < hi:
                        table = pa.Table.from_batches([batch])
                        if keep is None:
                            yield table.slice(lo - first, hi - lo), np.arange(lo, hi, dtype=np.int64)
                        else:  # keep is sorted: its rows in [lo, hi) are one slice of it
                            local = keep[np.searchsorted(keep, lo):np.searchsorted(keep, hi)]
                            if local.size:
                                yield table.take(pa.array(local - first)), local
                    first += batch.num_rows
                    if first >= stop:
                        break

    def _assemble(self, table: pa.Table, local: np.ndarray) -> pa.Table:
        columns = self.columns
        rows = local + self.fragment.first_row
        ids = (_integer_ids(table.column(columns["id_column"]), columns["id_column"]) if columns["id_column"]
               else rows)
        if columns["uri_column"]:
            uris = table.column(columns["uri_column"]).cast(pa.string())
        else:
            uris = pa.array([f"{self.fragment.key}#{r}" for r in local.tolist()], type=pa.string())
        if columns["label_column"]:
            labels = _integer_ids(table.column(columns["label_column"]), columns["label_column"])
            if labels.size and labels.min() < 0:
                raise ValueError(f"{self.fragment.key}: label_column {columns['label_column']!r}: labels must be >= 0, "
                                 f"got {labels.min()}")
        else:
            labels = np.full(len(table), -1, dtype=np.int64)
        out = {"row": pa.array(rows), "id": pa.array(ids), "uri": uris, "label": pa.array(labels),
               "image": _image_bytes(table.column(columns["image_column"]), columns["image_column"], self.image_format,
                                     columns["image_shape"], self.fragment.key)}
        for name in columns["metadata"]:
            out[name] = table.column(name)
        return pa.table(out)


def _consecutive_runs(groups: list[int]) -> list[list[int]]:
    """Sorted row-group numbers split where one is not the previous plus one: [1, 2, 5] → [[1, 2], [5]]."""
    runs: list[list[int]] = []
    for group in groups:
        if runs and group == runs[-1][-1] + 1:
            runs[-1].append(group)
        else:
            runs.append([group])
    return runs


def _regrouped(pieces: Iterator[tuple[pa.Table, np.ndarray]],
               rows: int) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """The rows of ``pieces`` (tables with their local rows) in blocks of ``rows`` (the last one
    smaller), in order."""
    tables: list[pa.Table] = []
    locals_: list[np.ndarray] = []
    held = 0
    for table, local in pieces:
        tables.append(table)
        locals_.append(local)
        held += len(table)
        while held >= rows:
            joined, joined_local = pa.concat_tables(tables), np.concatenate(locals_)
            yield joined.slice(0, rows), joined_local[:rows]
            tables, locals_, held = [joined.slice(rows)], [joined_local[rows:]], held - rows
    if held:
        yield pa.concat_tables(tables), np.concatenate(locals_)


def _integer_ids(column: pa.ChunkedArray, name: str) -> np.ndarray:
    if not pa.types.is_integer(column.type) or column.null_count:
        raise ValueError(f"{name}: expected an integer column without nulls, got {column.type} "
                         f"with {column.null_count} null(s)")
    return column.to_numpy().astype(np.int64)


def _image_bytes(column: pa.ChunkedArray, name: str, image_format: ImageFormat, image_shape: tuple[int, ...] | None,
                 where: str) -> pa.Array:
    """An image column → binary (encoded bytes, or raw uint8 HWC pixels)."""
    column = column.combine_chunks()
    if column.null_count:
        raise ValueError(f"{where}: image_column {name!r}: {column.null_count} row(s) have no image")
    if pa.types.is_struct(column.type):
        if column.type.get_field_index("bytes") < 0:
            raise ValueError(f"{where}: image_column {name!r}: struct column has no 'bytes' field")
        column = column.field("bytes")
    if image_format.kind == "encoded":
        return column.cast(pa.binary())
    return raw_image_column(_array_images(column, name, image_shape))


# --------------------------------------------------------------------------- image files


class ImageFilesSource(GallerySource):
    """Image files under a directory or prefix, sorted by path (module docstring).

    labels: ``folder`` takes each file's first folder below ``path`` as its class (classes sorted
            by name); None (default) gives an unlabelled gallery.
    The listing (one path per item) is held by the driver: for galleries beyond a few million
    items, a Parquet dataset is the better form.
    """

    kind = "image_files"

    def __init__(self, path: str, labels: str | None = None, storage_options: dict[str, Any] | None = None):
        if labels not in (None, "folder"):
            raise ValueError(f"labels: expected 'folder' or null, got {labels!r}")
        fs, files = _list_files(path, IMAGE_EXTENSIONS, storage_options)
        root = fs._strip_protocol(str(path)).rstrip("/")
        self.storage_options = dict(storage_options or {})
        self.uris = [_full_uri(fs, f) for f in files]
        self.has_labels = labels == "folder"
        if self.has_labels:
            folders = [f[len(root) + 1:].split("/")[0] if "/" in f[len(root) + 1:] else None for f in files]
            loose = [f for f, d in zip(files, folders) if d is None]
            if loose:
                raise ValueError(f"labels: folder: {loose[0]} is not inside a class folder of {path}")
            self._classes = sorted(set(folders))
            lookup = {name: i for i, name in enumerate(self._classes)}
            self.labels = np.array([lookup[d] for d in folders], dtype=np.int64)
        else:
            self._classes, self.labels = [], None
        fragments = [Fragment(f"files[{start}:]", start, min(_FILES_PER_FRAGMENT, len(files) - start))
                     for start in range(0, len(files), _FILES_PER_FRAGMENT)]
        super().__init__(f"image_files {path}", fragments)

    def reader(self, fragment: Fragment) -> FragmentReader:
        span = slice(fragment.first_row, fragment.first_row + fragment.num_rows)
        labels = None if self.labels is None else self.labels[span]
        return _FilesReader(fragment.first_row, tuple(self.uris[span]), labels, self.storage_options)

    def class_names(self, count: int) -> list[str]:
        return list(self._classes)


@dataclass(frozen=True)
class _FilesReader(FragmentReader):
    first_row: int
    uris: tuple[str, ...]
    labels: np.ndarray | None
    storage_options: dict[str, Any]

    def blocks(self, start, stop, keep=None, block_rows=4096):
        local = np.arange(start, stop, dtype=np.int64) if keep is None else np.asarray(keep, dtype=np.int64)
        for first in range(0, local.size, block_rows):
            part = local[first:first + block_rows]
            uris = [self.uris[i] for i in part]
            fs, _ = fsspec.core.url_to_fs(uris[0], **self.storage_options)
            contents = fs.cat([fs._strip_protocol(u) for u in uris])
            rows = part + self.first_row
            yield pa.table({
                "row": pa.array(rows), "id": pa.array(rows), "uri": pa.array(uris, type=pa.string()),
                "label": pa.array(np.full(part.size, -1, dtype=np.int64) if self.labels is None else self.labels[part]),
                "image": pa.array([contents[fs._strip_protocol(u)] for u in uris], type=pa.binary()),
            })


# --------------------------------------------------------------------------- in memory


class MemorySource(GallerySource):
    """A ``LabeledImages`` already loaded by a data source (the digits, CIFAR…), rows sorted by id,
    so the row ranges of the initial shards are the contiguous id blocks of ``gallery.layout``."""

    kind = "memory"
    has_labels = True

    def __init__(self, images: LabeledImages, description: str):
        order = np.argsort(images.ids, kind="stable")
        self.images = images if np.array_equal(order, np.arange(len(images))) else images.subset(order)
        self.image_format = ImageFormat("raw", tuple(int(s) for s in self.images.images.shape[1:]))
        self.prefix = description
        super().__init__(description, [Fragment(description, 0, len(images))])

    def reader(self, fragment: Fragment) -> FragmentReader:
        return _MemoryReader(self)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The rows of the items ``ids`` (all must be in the source)."""
        ids = np.asarray(ids, dtype=np.int64)
        rows = np.clip(np.searchsorted(self.images.ids, ids), 0, len(self.images) - 1)
        if not np.array_equal(self.images.ids[rows], ids):
            raise ValueError(f"{self.description}: items {ids[self.images.ids[rows] != ids][:5].tolist()} are not in the source")
        return rows

    def class_names(self, count: int) -> list[str]:
        return list(self.images.class_names)

    def labelled_sample(self, max_items: int, image_size: int, seed: int = 0) -> LabeledImages | None:
        if len(self.images) <= max_items and self.images.images.shape[1:3] == (image_size, image_size):
            return self.images
        return super().labelled_sample(max_items, image_size, seed)


@dataclass(frozen=True)
class _MemoryReader(FragmentReader):
    source: MemorySource

    def blocks(self, start, stop, keep=None, block_rows=4096):
        images = self.source.images
        local = np.arange(start, stop, dtype=np.int64) if keep is None else np.asarray(keep, dtype=np.int64)
        for first in range(0, local.size, block_rows):
            rows = local[first:first + block_rows]
            yield pa.table({
                "row": pa.array(rows), "id": pa.array(images.ids[rows]),
                "uri": pa.array([f"{self.source.prefix}#{i}" for i in images.ids[rows].tolist()], type=pa.string()),
                "label": pa.array(images.labels[rows]),
                "image": raw_image_column(images.images[rows]),
            })
