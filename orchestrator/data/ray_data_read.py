"""A gallery read by Ray Data (``gallery.source: ray_data``): the read's description, checked
without Ray, and the gallery source over its *snapshot*.

``gallery.options`` names one of Ray Data's ``read_*`` functions (``READS``), its arguments, and
which columns are the item id, the image (encoded bytes, or a uint8 array such as ``read_images``
gives), the URI and, optionally, the label and metadata columns. Plans and backfills address
items by *row*, and a Ray Data read gives its rows in no stable order (its tasks finish in any
order; a table may change between runs). So the first time a pipeline opens such a gallery, Ray
Data workers run the read, bring the columns into the project's convention, sort the rows by id
and write them as Parquet files under ``<storage>/galleries/<gallery>/source/<digest>/``, with a
``manifest.json`` written last (``orchestrator.distributed.ray_data_snapshot``). That snapshot is
the gallery: row ``r`` is row ``r`` of its files in the manifest's order (ids ascending), every
later run reads it, and it is never rewritten while its manifest exists.

- ``id_column``: unique integers without nulls (a duplicate is an error naming the id). Required,
  except for the reads of files (``images``, ``binary_files``), whose items without an id column
  are numbered by the rank of their path in sorted path order.
- ``image_column``: encoded bytes (PNG, JPEG…; or a struct with a ``bytes`` field) are kept as
  they are; arrays (``read_images``' tensors, nested lists) are stored as PNG (lossless).
- ``uri_column``: default the file path for the reads of files, else ``<read>:<id>``.
- ``sql``: ``url`` names the database (``sqlite:///path`` or ``postgresql://user@host/db``) and
  ``query`` the SELECT; the password comes from ``PGPASSWORD`` or ``~/.pgpass`` (libpq reads
  them), never from the URL (refused).

The digest is the sha256 of the canonical description (read, arguments, columns, url, query;
not the resource arguments such as ``concurrency``): changing what is read makes another
snapshot. Nothing here imports Ray or torch: validating a pipeline file stays quick.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from orchestrator.data.gallery_sources import RESERVED_COLUMNS, Fragment, ImageFormat, ParquetDatasetSource
from orchestrator.errors import UsageError

#: Arguments every read takes that change how it runs, not what it reads (left out of the digest).
RESOURCE_ARGS = ("num_cpus", "num_gpus", "memory", "concurrency", "override_num_blocks")
#: The Ray Data reads a gallery can name (ray 2.60's ``ray.data.read_<name>``), each with the
#: arguments it accepts from a file and the one that names the data (required).
READS: dict[str, dict[str, Any]] = {
    "parquet": {"data": "paths", "args": ("paths", "columns", "file_extensions")},
    "images": {"data": "paths", "args": ("paths", "size", "mode", "file_extensions")},
    "binary_files": {"data": "paths", "args": ("paths", "file_extensions")},
    "lance": {"data": "uri", "args": ("uri", "version", "columns", "filter", "storage_options")},
    "sql": {"data": None, "args": ("sql_params", "shard_keys")},
}
#: The reads of files: their rows carry the file's path (``include_paths``).
FILE_READS = {"images": ("image", "path"), "binary_files": ("bytes", "path")}
SQL_SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")
MANIFEST = "manifest.json"
SNAPSHOT_FORMAT = 1


class ReadOptionError(UsageError, ValueError):
    """A ``ray_data`` option that cannot be used: ``field`` (below ``gallery.options``), the value
    and why; ``str()`` is the one line ``gallery.options.<field>: <reason> (got <value>)``."""

    def __init__(self, field: str, reason: str, value: Any):
        self.field, self.reason, self.value = field, reason, value
        super().__init__(f"gallery.options.{field}: {reason} (got {value!r})")


class SnapshotError(UsageError, ValueError):
    """The read's rows cannot form a gallery (a duplicate id, a column of the wrong type): one line."""


def _plain(value: Any, where: str) -> Any:
    """``value`` if it is plain data (what YAML gives: str, numbers, bools, None, lists, maps)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, where) for k, v in value.items()}
    raise ReadOptionError(where, "only plain values (strings, numbers, lists, maps) can be passed to a read",
                          type(value).__name__)


def password_in_url(url: str) -> bool:
    """Whether a database URL carries a password (``user:password@`` or ``?password=``)."""
    parts = urlsplit(url)
    return parts.password is not None or any(k.lower() == "password" for k, _ in parse_qsl(parts.query))


def shown_url(url: str) -> str:
    """A database URL as it may be shown: a password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
        parts = parts._replace(netloc=netloc)
    query = "&".join(f"{k}={'***' if k.lower() == 'password' else v}" for k, v in parse_qsl(parts.query))
    return parts._replace(query=query).geturl()


@dataclass(frozen=True)
class RayDataRead:
    """The options of a ``ray_data`` gallery (module docstring); raises ``ReadOptionError``.

    read:             a Ray Data read (``READS``): parquet, images, binary_files, lance, sql.
    args:             its keyword arguments (``READS[read]['args']`` and the resource arguments
                      ``RESOURCE_ARGS``), e.g. ``{paths: ./photos/}`` or ``{uri: ./gallery.lance}``.
    id_column:        unique integer ids (required unless the read is of files: then the rank of
                      the path).
    image_column:     encoded image bytes or uint8 arrays; default ``image`` (``bytes`` for
                      binary_files).
    uri_column:       where each item lives; default the path (reads of files) or ``<read>:<id>``.
    label_column:     integer class labels ≥ 0; default none (an unlabelled gallery).
    metadata_columns: further columns carried into the shard files and search results.
    url, query:       ``sql`` only: the database URL (no password in it) and the SELECT.
    """

    read: str
    args: dict[str, Any] = field(default_factory=dict)
    id_column: str | None = None
    image_column: str | None = None
    uri_column: str | None = None
    label_column: str | None = None
    metadata_columns: Sequence[str] = ()
    url: str | None = None
    query: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.read, str) or self.read not in READS:
            raise ReadOptionError("read", f"not a Ray Data read this project takes; known: {', '.join(READS)}",
                                  self.read)
        if not isinstance(self.args, Mapping):
            raise ReadOptionError("args", "a map of the read's keyword arguments", self.args)
        accepted = (*READS[self.read]["args"], *RESOURCE_ARGS)
        for name, value in self.args.items():
            if name not in accepted:
                managed = {"include_paths": "set by the project (the reads of files keep their paths)",
                           "sql": "give the SELECT as gallery.options.query",
                           "connection_factory": "give the database as gallery.options.url"}.get(name)
                raise ReadOptionError(f"args.{name}", managed or f"not an argument read_{self.read} takes from a "
                                      f"file; accepted: {', '.join(accepted)}", value)
            _plain(value, f"args.{name}")
        data = READS[self.read]["data"]
        if data is not None and self.args.get(data) in (None, "", []):
            raise ReadOptionError(f"args.{data}", f"read_{self.read} needs the data it reads", self.args.get(data))
        for name in ("id_column", "image_column", "uri_column", "label_column"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ReadOptionError(name, "a column name", value)
        if self.id_column is None and self.read not in FILE_READS:
            raise ReadOptionError("id_column", f"required for read_{self.read}: the column of unique integer ids "
                                  "(plans and backfills address items by their order)", None)
        if isinstance(self.metadata_columns, str) or not all(isinstance(c, str) and c for c in self.metadata_columns):
            raise ReadOptionError("metadata_columns", "a list of column names", self.metadata_columns)
        clashes = [c for c in self.metadata_columns if c in RESERVED_COLUMNS]
        if clashes:
            raise ReadOptionError("metadata_columns", f"reserved names ({', '.join(RESERVED_COLUMNS)})", clashes)
        self._check_sql()

    def _check_sql(self) -> None:
        if self.read != "sql":
            for name in ("url", "query"):
                if getattr(self, name) is not None:
                    raise ReadOptionError(name, "only read: sql takes it", getattr(self, name))
            return
        if not isinstance(self.url, str) or not self.url:
            raise ReadOptionError("url", "read: sql needs the database URL (sqlite:///path or "
                                  "postgresql://user@host/db)", self.url)
        if password_in_url(self.url):
            raise ReadOptionError("url", "never a password in the URL: give it in PGPASSWORD or ~/.pgpass",
                                  shown_url(self.url))
        if urlsplit(self.url).scheme not in SQL_SCHEMES:
            raise ReadOptionError("url", f"scheme must be one of {', '.join(SQL_SCHEMES)}", self.url)
        if not isinstance(self.query, str) or not self.query.strip():
            raise ReadOptionError("query", "read: sql needs the SELECT that gives the gallery's rows", self.query)

    # --- what the snapshot is made of -------------------------------------------------------------
    @property
    def image(self) -> str:
        return self.image_column or FILE_READS.get(self.read, ("image",))[0]

    @property
    def uri(self) -> str | None:
        return self.uri_column or (FILE_READS[self.read][1] if self.read in FILE_READS else None)

    @property
    def sort_key(self) -> str:
        """The snapshot's order: ``id`` (the id column), else ``uri`` (the path of a file read)."""
        return "id" if self.id_column is not None else "uri"

    def description(self) -> dict[str, Any]:
        """The canonical description (what is read and how its columns are taken): the digest's input."""
        return {"read": self.read, "args": {k: v for k, v in sorted(self.args.items()) if k not in RESOURCE_ARGS},
                "id_column": self.id_column, "image_column": self.image, "uri_column": self.uri,
                "label_column": self.label_column, "metadata_columns": list(self.metadata_columns),
                "url": self.url, "query": self.query, "format": SNAPSHOT_FORMAT}

    @property
    def digest(self) -> str:
        text = json.dumps(self.description(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def read_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``ray.data.read_<read>`` (in the driver: relative local paths
        made absolute, since the read tasks need not run in this folder; a Lance dataset on S3
        without ``storage_options`` reached through the storage's endpoint,
        ``storage.filesystem.object_store_options``)."""
        kwargs = {k: _plain(v, f"args.{k}") for k, v in self.args.items()}
        data = READS[self.read]["data"]
        if data is not None:
            kwargs[data] = _absolute(kwargs[data])
        if self.read in FILE_READS:
            kwargs["include_paths"] = True
        if self.read == "lance" and "storage_options" not in kwargs:
            from orchestrator.storage.filesystem import object_store_options

            kwargs.update({"storage_options": found} if (found := object_store_options(kwargs["uri"])) else {})
        if self.read == "sql":
            kwargs["sql"] = self.query
            kwargs["connection_factory"] = SqlConnection(_absolute_sqlite(self.url))
        return kwargs


def _absolute(paths: Any) -> Any:
    if isinstance(paths, list):
        return [_absolute(p) for p in paths]
    if isinstance(paths, str) and "://" not in paths:
        return os.path.abspath(os.path.expanduser(paths))
    return paths


def _absolute_sqlite(url: str) -> str:
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
        return "sqlite:///" + os.path.abspath(os.path.expanduser(url[len("sqlite:///"):]))
    return url


@dataclass(frozen=True)
class SqlConnection:
    """The ``connection_factory`` of ``read_sql`` for a URL (picklable: it travels to the read
    tasks): ``sqlite:///path`` opens the file read-only; ``postgresql://user@host[:port]/db`` connects
    through psycopg, whose libpq takes the password from ``PGPASSWORD`` or ``~/.pgpass``."""

    url: str

    def __call__(self):
        if password_in_url(self.url):
            raise ValueError(f"gallery.options.url: never a password in the URL (got {shown_url(self.url)})")
        scheme = urlsplit(self.url).scheme
        if scheme == "sqlite":
            import sqlite3

            path = self.url[len("sqlite:///"):]
            if not os.path.exists(path):
                raise FileNotFoundError(f"gallery.options.url: no SQLite database at {path}")
            return sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        import psycopg

        return psycopg.connect(self.url.replace(scheme + "://", "postgresql://", 1))


def read_spec(options: Mapping[str, Any]) -> RayDataRead:
    """``RayDataRead`` from a file's ``gallery.options`` (unknown options: ``ReadOptionError``)."""
    known = RayDataRead.__dataclass_fields__
    unknown = [k for k in options if k not in known]
    if unknown:
        raise ReadOptionError(unknown[0], f"unknown option of source 'ray_data'; accepted: {', '.join(known)}",
                              options[unknown[0]])
    if "read" not in options:
        raise ReadOptionError("read", f"required: one of {', '.join(READS)}", None)
    return RayDataRead(**options)


# --------------------------------------------------------------------------- the snapshot, read


class RayDataSnapshotSource(ParquetDatasetSource):
    """The gallery over a complete snapshot: its Parquet files in the manifest's order (rows by id,
    or by path for a file read without ids), columns ``id`` (when the read has ids), ``uri``,
    ``image`` (encoded bytes), ``label`` (when given) and the metadata columns. Built from the
    manifest alone: opening it reads no data file."""

    kind = "ray_data"

    def __init__(self, folder: str, manifest: Mapping[str, Any], storage_options: Mapping[str, Any] | None = None):
        description = manifest["description"]
        self.folder, self.manifest = folder, dict(manifest)
        self.columns = {"image_column": "image", "id_column": "id" if manifest["sort_key"] == "id" else None,
                        "uri_column": "uri", "label_column": "label" if description["label_column"] else None,
                        "metadata": tuple(description["metadata_columns"]), "image_shape": None}
        self.metadata_columns = tuple(description["metadata_columns"])
        self.has_labels = description["label_column"] is not None
        self.storage_options = dict(storage_options or {})
        self.image_format = ImageFormat("encoded")
        fragments, first = [], 0
        for entry in manifest["files"]:
            fragments.append(Fragment(f"{folder.rstrip('/')}/{entry['name']}", first, int(entry["rows"])))
            first += int(entry["rows"])
        super(ParquetDatasetSource, self).__init__(f"ray_data read_{description['read']} (snapshot "
                                                   f"{manifest['digest']})", fragments)


def snapshot_folder(gallery_root: str, read: RayDataRead) -> str:
    """Where ``read``'s snapshot of the gallery at ``gallery_root`` lives."""
    return f"{gallery_root.rstrip('/')}/source/{read.digest}"


def read_manifest(folder: str, storage_options: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], bytes] | None:
    """(the manifest, its bytes) of the snapshot in ``folder``, or None when it has none (no
    snapshot, or a partial one)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(f"{folder.rstrip('/')}/{MANIFEST}", **dict(storage_options or {}))
    if not fs.exists(path):
        return None
    data = fs.cat_file(path)
    return json.loads(data), data
