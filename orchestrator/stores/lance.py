"""The Lance store: a gallery's vectors in Lance datasets (embedded: files under a folder, local
or object storage), the format LanceDB serves.

What it creates (nothing else; docs/stores.md): under its folder (``store.path``, default
``<storage>/galleries/<gallery>/lance``) one dataset per generation, ``<generation>.lance``, with
the columns ``shard`` int32, ``version`` string, ``id`` int64, ``label`` int64, ``uri`` string,
``embedding`` fixed-size list of float32 (the stored coordinates, ``stores.vectors``; with an
approximate index over a hyperbolic gallery also ``search``, their MIPS→L2 search coordinates; in a
non-Euclidean gallery also ``raw``, the raw embeddings a forward path maps through F:
``stores.vectors.row_columns``), and
with ``store.index`` an ``IVF_PQ`` or ``IVF_HNSW_SQ`` vector index on the column the search ranks
by (``stores.vectors.search_metric``) once a dataset holds enough rows (``MIN_INDEX_ROWS``); rows
appended later are searched unindexed (flat) until the index is rebuilt.

Writes: a worker appends one shard update's rows as one Lance commit (a new table version): the
rows appear all at once or not at all; Lance retries concurrent appends of other updates, and the
worker reads the count back (``LanceStore._append``: concurrent creations of one dataset lose rows). The
rows carry their ``version`` (the digest of their ids and vectors); no query reaches them until
the lineage commit names ``(shard, version)``: every search filters on the versions the lineage
(or a deployment, or a server's snapshot) names, before the vector search (``prefilter``).
A retry of the same rows deletes the earlier ones first (they were never named).
"""
from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import numpy as np

from orchestrator.integrity import ids_sha256
from orchestrator.stores.locations import StoreLocation
from orchestrator.stores.vectors import (
    EarlierLayout,
    check_layout,
    check_servable,
    check_stored_rows,
    query_coordinates,
    rerank,
    row_columns,
    rows_digest,
    search_metric,
    shard_columns,
    stored_coordinates,
)

VERSION_CHARS = 20
MIN_INDEX_ROWS = 4096
BATCH_SCAN_ROWS = 65536  # an exact shard this small is read once per batch of queries (LanceShard)
_COMMIT_TRIES = 5


_Method = TypeVar("_Method", bound=Callable[..., Any])


def reaching_storage(method: _Method) -> _Method:
    """``method`` of a ``LanceStore`` or ``LanceShard`` (each has the store's ``path``) with Lance's
    I/O errors on object storage (a ValueError "LanceError(IO): Generic S3 error: …" measured with
    Lance 14 against an S3 endpoint that does not answer; from a scan, pyarrow's ArrowInvalid
    "External error: LanceError(IO): …") raised as the storage's ``OutsideSystemError``
    (``storage.filesystem.s3_unreachable``: the location, the endpoint and what to check), as the
    project's other S3 clients' are."""
    @functools.wraps(method)
    def reaching(store: "LanceStore | LanceShard", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(store, *args, **kwargs)
        except (ValueError, OSError) as error:
            if "://" in store.path and "LanceError(IO)" in str(error):
                from orchestrator.storage.filesystem import s3_unreachable

                raise s3_unreachable(store.path, error) from error
            raise
    return cast(_Method, reaching)


def dataset_name(generation: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", generation) + ".lance"


@dataclass(frozen=True)
class LanceStore:
    """A gallery's Lance datasets under ``path`` (module docstring)."""

    path: str
    index: str = "exact"
    index_options: Mapping[str, Any] = field(default_factory=dict)
    overfetch: int = 4
    kind: str = "lance"

    def describe(self) -> str:
        return f"lance store {self.path}"

    def check_reachable(self) -> None:
        return None  # a folder of the storage (checked before every command) or of the path's filesystem

    @property
    def _object_store(self) -> dict[str, str]:
        """Lance's options to reach ``path`` (``storage.filesystem.object_store_options``: on S3 the
        storage's endpoint; none locally)."""
        from orchestrator.storage.filesystem import object_store_options

        return object_store_options(self.path)

    def _uri(self, name: str) -> str:
        return f"{self.path.rstrip('/')}/{name}"

    def _open(self, name: str):
        import lance

        try:
            return lance.dataset(self._uri(name), storage_options=self._object_store)
        except (ValueError, FileNotFoundError, OSError) as error:
            if "not found" in str(error).lower() or "does not exist" in str(error).lower() or isinstance(
                    error, FileNotFoundError):
                return None
            raise

    def _location(self, uri: str) -> StoreLocation:
        location = StoreLocation.parse(uri)
        if location.scheme != "lance" or location.table is None:
            raise ValueError(f"not a lance location: {uri}")
        return location

    @staticmethod
    def _filter(location: StoreLocation) -> str:
        return f"shard = {int(location.shard)} AND version = '{location.version}'"

    @reaching_storage
    def write_shard(self, shard_index: int, shard, key: str, first_attempt: bool) -> tuple[str, dict[str, Any]]:
        import pyarrow as pa

        from orchestrator.storage.overwrite import UnknownArtefact

        vectors = stored_coordinates(shard.embeddings, shard.space, shard.curv)
        names = row_columns(shard.space, self.index)
        values = shard_columns(shard.embeddings, vectors, names)
        digest = rows_digest(shard.ids, *values.values())
        name = dataset_name(shard.generation)
        location = StoreLocation("lance", self.path, int(shard_index), digest[:VERSION_CHARS], name)
        attributes = shard.attributes
        uris = attributes.column("uri").to_pylist() if attributes is not None and "uri" in attributes.column_names \
            else [None] * len(shard.ids)
        n = len(shard.ids)
        columns = {"shard": pa.array(np.full(n, shard_index, np.int32)),
                   "version": pa.array([location.version] * n, pa.string()),
                   "id": pa.array(np.asarray(shard.ids, np.int64)),
                   "label": pa.array(np.asarray(shard.labels, np.int64)),
                   "uri": pa.array(uris, pa.string())}
        for column, rows in values.items():
            columns[column] = pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), rows.shape[1])
        table = pa.table(columns)
        dataset = self._open(name)
        missing = [] if dataset is None else [column for column in values if column not in dataset.schema.names]
        if missing:
            raise EarlierLayout(f"lance store {self.path} dataset {name}: written by an earlier layout without the "
                                f"column(s) {', '.join(missing)} (or with another store.index); run `orchestrator verify FILE "
                                "--migrate-stores` to add and fill them in place, then re-run")
        held = None if dataset is None else dataset.count_rows(filter=self._filter(location))
        if first_attempt and held:
            raise UnknownArtefact(f"{key}: {location.describe()} already holds rows, although the step is on its "
                                  "first attempt (so the lineage does not know them); refusing to replace them")
        self._maybe_index(name, shard.space, self._append(name, table, location, dataset, held))
        return location.uri, {"kind": "lance", "sha256": digest, "ids_sha256": ids_sha256(shard.ids),
                              "n_items": int(n), "space": shard.space, "curv": float(shard.curv),
                              "dim": int(np.asarray(shard.embeddings).shape[1]), "index": self.index,
                              "index_options": dict(self.index_options), "overfetch": int(self.overfetch),
                              "columns": names}

    def _append(self, name: str, table, location: StoreLocation, dataset, held: int | None):
        """Append ``table`` (one shard update's rows, all at ``location``) to dataset ``name`` as one
        commit, check that they are there afterwards and return the dataset as read then.
        ``dataset``: ``name`` as the caller opened it (None: it did not exist then); ``held``: the
        rows at ``location`` the caller counted in it (None: not counted).

        Lance loses rows when several writers create one dataset at once (measured with Lance 14:
        concurrent ``create`` or first ``append`` commits each report success, and the later one
        replaces the earlier's rows). So the dataset is created empty first (a lost empty creation
        loses nothing), the rows are appended (Lance retries concurrent appends itself), and the
        rows' count is read back from the newest version: a commit is atomic, so the count is 0 (lost:
        append again) or all of them. A count in between (rows of an attempt that raised after its
        commit, plus a partial something) is deleted and written again; all of them (an earlier
        attempt's commit: the location is the rows' digest) are kept. The dataset is opened
        twice per update, before and after the append, and once more right before creating it
        (each opening reads its manifest: a round trip on object storage)."""
        import lance

        n = table.num_rows
        for attempt in range(_COMMIT_TRIES):
            try:
                if dataset is None:  # as late as can be: a create racing another's rows replaces them
                    dataset = self._create_empty(name, table.schema)
                if held is None:
                    held = dataset.count_rows(filter=self._filter(location))
                if held == n:
                    return dataset
                if held:
                    dataset.delete(self._filter(location))
                lance.write_dataset(table, self._uri(name), mode="append", storage_options=self._object_store)
                dataset = self._open(name)
                held = None if dataset is None else dataset.count_rows(filter=self._filter(location))
                if held == n:
                    return dataset
            except OSError:
                if attempt == _COMMIT_TRIES - 1:
                    raise
                dataset, held = None, None  # read again inside the next try (``_create_empty`` opens first)
            time.sleep(0.2 * (attempt + 1))
        raise OSError(f"lance store {self.path} dataset {name}: the {n} rows of {location.describe()} were not "
                      f"there after {_COMMIT_TRIES} appends (concurrent writers replacing the dataset?)")

    def _create_empty(self, name: str, schema):
        """Dataset ``name`` as it is after creating it with ``schema`` and no rows unless it exists.
        On a local (or shared POSIX) folder the check and the creation hold a lock file beside the
        datasets: a creation that raced rows appended meanwhile replaced them (measured under load:
        3 writers' rows of 6 lost). On object storage Lance's own commit decides, and the count read
        back after each append (``_append``) catches a loss that happens before it."""
        import lance

        if "://" in self.path:
            existing = self._open(name)
            if existing is not None:
                return existing
            try:
                return lance.write_dataset(schema.empty_table(), self._uri(name), mode="create",
                                           storage_options=self._object_store)
            except OSError as error:
                if "already exists" not in str(error).lower():
                    raise
            return self._open(name)
        import fcntl

        os.makedirs(self.path, exist_ok=True)
        with open(os.path.join(self.path, f".{name}.create-lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            existing = self._open(name)
            if existing is not None:
                return existing
            return lance.write_dataset(schema.empty_table(), self._uri(name), mode="create",
                                       storage_options=self._object_store)

    def _maybe_index(self, name: str, space: str, dataset, force: bool = False) -> None:
        """Build the dataset's vector index once ``dataset`` (``name`` as last read) holds
        ``MIN_INDEX_ROWS`` rows (``force``: rebuild now)."""
        if self.index == "exact":
            return
        if dataset is None or (not force and (dataset.count_rows() < MIN_INDEX_ROWS or dataset.list_indices())):
            return
        self.build_index(name, space)

    @reaching_storage
    def build_index(self, name: str, space: str) -> None:
        dataset = self._open(name)
        options = dict(self.index_options)
        column, metric = search_metric(space, self.index)
        n = dataset.count_rows()
        partitions = int(options.get("num_partitions", max(1, min(256, int(np.sqrt(n))))))
        kwargs: dict[str, Any] = {"num_partitions": partitions, "metric": metric, "replace": True}
        if self.index == "ivf_pq":
            dim = dataset.schema.field(column).type.list_size
            width = next(w for w in (4, 3, 2, 1) if dim % w == 0)  # narrow sub-vectors: a hyperboloid point's
            sub = int(options.get("num_sub_vectors", dim // width))  # time coordinate dwarfs the others
            dataset.create_index(column, index_type="IVF_PQ", num_sub_vectors=sub, **kwargs)
        else:
            dataset.create_index(column, index_type="IVF_HNSW_SQ", **kwargs)

    @reaching_storage
    def count(self, uri: str) -> int:
        location = self._location(uri)
        dataset = self._open(location.table)
        return 0 if dataset is None else int(dataset.count_rows(filter=self._filter(location)))

    @reaching_storage
    def read_rows(self, uri: str, columns: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(ids (N,) int64 ascending, column → its (N, ·) float32 values in that order) of the rows at ``uri``."""
        location = self._location(uri)
        dataset = self._open(location.table)
        if dataset is None:
            return np.zeros(0, np.int64), {column: np.zeros((0, 0), np.float32) for column in columns}
        table = dataset.to_table(columns=["id", *columns], filter=self._filter(location))
        ids = table.column("id").to_numpy().astype(np.int64)
        order = np.argsort(ids, kind="stable")
        return ids[order], {column: np.ascontiguousarray(_vectors(table.column(column), len(ids))[order])
                            for column in columns}

    def open_shard(self, uri: str, record: Mapping[str, Any] | None, n_items: int | None = None):
        held = self.count(uri)
        where = StoreLocation.parse(uri).describe()
        check_servable(where, record, held)
        check_layout(where, record, [search_metric(record["space"], record.get("index", "exact"))[0]],
                     "the column its search ranks by")
        return LanceShard(self, uri, dict(record), held)

    def check_shard(self, uri: str, record: Mapping[str, Any] | None, n_items: int | None = None) -> None:
        check_stored_rows(self, uri, self._location(uri).describe(), record)

    @reaching_storage
    def add_columns(self, name: str, locations: list[tuple[str, np.ndarray, dict[str, np.ndarray]]],
                    space: str) -> None:
        """``stores.migrate``: one new version of dataset ``name`` with the columns ``locations``
        ((location URI, its ids ascending, column → (N, ·) values)) carry (null in rows no location
        names), its vector index rebuilt on the column its search ranks by."""
        import lance
        import pyarrow as pa

        table = self._open(name).to_table()
        shards, versions = table.column("shard").to_numpy(), np.asarray(table.column("version").to_pylist(), dtype=object)
        row_ids = table.column("id").to_numpy()
        widths = {column: values.shape[1] for _uri, _ids, added in locations for column, values in added.items()}
        filled, present = {}, {}
        for column, width in widths.items():  # a column an interrupted migration added keeps its values
            held = table.column(column) if column in table.column_names else None
            present[column] = np.zeros(len(table), bool) if held is None else held.is_valid().to_numpy(zero_copy_only=False)
            filled[column] = np.zeros((len(table), width), np.float32)
            if held is not None:
                filled[column][present[column]] = _vectors(held.filter(held.is_valid()), int(present[column].sum()))
                table = table.drop_columns([column])
        for uri, _ids, added in locations:
            location = self._location(uri)
            rows = np.flatnonzero((shards == location.shard) & (versions == location.version))
            rows = rows[np.argsort(row_ids[rows], kind="stable")]  # in the order of ``ids`` (ascending)
            for column, values in added.items():
                filled[column][rows], present[column][rows] = values, True
        for column, width in widths.items():
            array = pa.FixedSizeListArray.from_arrays(pa.array(filled[column].reshape(-1)), width,
                                                      mask=pa.array(~present[column]))
            table = table.append_column(column, array)
        written = lance.write_dataset(table, self._uri(name), mode="overwrite", storage_options=self._object_store)
        self._maybe_index(name, space, written, force=True)

    def datasets(self) -> list[str]:
        from orchestrator.storage.filesystem import list_dir

        try:
            return sorted(name.rstrip("/").rsplit("/", 1)[-1] for name in list_dir(self.path)
                          if name.rstrip("/").endswith(".lance"))
        except FileNotFoundError:
            return []

    @reaching_storage
    def locations(self) -> list[str]:
        found = []
        for name in self.datasets():
            dataset = self._open(name)
            if dataset is None:
                continue
            table = dataset.to_table(columns=["shard", "version"])
            pairs = set(zip(table.column("shard").to_pylist(), table.column("version").to_pylist())) if len(table) \
                else set()
            found += [StoreLocation("lance", self.path, int(s), v, name).uri for s, v in pairs]
        return sorted(found)

    @reaching_storage
    def remove(self, uris: Iterable[str]) -> None:
        for uri in uris:
            location = self._location(uri)
            dataset = self._open(location.table)
            if dataset is not None:
                dataset.delete(self._filter(location))


class LanceShard:
    """One shard's rows in a Lance dataset, searched as the router searches a shard index:
    ``overfetch · k`` candidates per query (filtered to the shard's version before the vector
    search), re-ranked with the space's exact distance (``stores.vectors``). Without an approximate
    index, a shard of at most ``BATCH_SCAN_ROWS`` rows is read once for a batch of queries and
    every row ranked exactly (a Lance scan per query cost 6-9 s of a 539-query evaluation on
    135-row shards); a larger one is scanned per query, so memory stays bounded."""

    def __init__(self, store: LanceStore, uri: str, record: dict[str, Any], n_rows: int):
        self.store, self.uri, self.record = store, uri, record
        self.location = store._location(uri)
        self.space, self.curv, self.dim = record["space"], float(record["curv"]), int(record["dim"])
        self.kind = {"hnsw": "hnsw", "ivf_pq": "ivf"}.get(record.get("index", "exact"), "flat")
        self._ntotal = n_rows
        self._dataset = store._open(self.location.table)

    @property
    def ntotal(self) -> int:
        return self._ntotal

    @property
    def path(self) -> str:
        return self.store.path

    @reaching_storage
    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = np.asarray(queries, dtype=np.float64)
        index = self.record.get("index", "exact")
        coords, searched = query_coordinates(queries, self.space, self.curv, index)
        if self.kind == "flat" and self.ntotal <= BATCH_SCAN_ROWS:  # one scan for the batch, not one per query
            table = self._dataset.to_table(columns=["id", "embedding"], filter=LanceStore._filter(self.location))
            ids = table.column("id").to_numpy().astype(np.int64)
            rows = _vectors(table.column("embedding"), len(ids))
            return rerank(coords, [ids] * len(coords), [rows] * len(coords), k, self.space, self.curv)
        fetch = max(k, min(self.ntotal, k * self.store.overfetch))
        column, metric = search_metric(self.space, index)
        options = dict(self.store.index_options)
        found, vectors = [], []
        for vector in searched:
            nearest: dict[str, Any] = {"column": column, "q": vector, "k": fetch, "metric": metric,
                                       "use_index": self.kind != "flat"}
            if self.kind != "flat":
                nearest["nprobes"] = int(options.get("nprobes", 20))
            table = self._dataset.to_table(columns=["id", "embedding"], nearest=nearest,
                                           filter=LanceStore._filter(self.location), prefilter=True,
                                           disable_scoring_autoprojection=True)
            ids = table.column("id").to_numpy().astype(np.int64)
            found.append(ids)
            vectors.append(_vectors(table.column("embedding"), len(ids)))
        return rerank(coords, found, vectors, k, self.space, self.curv)


def _vectors(column, n: int) -> np.ndarray:
    """A fixed-size-list column of ``n`` rows → (n, width) float32."""
    values = column.combine_chunks()
    width = values.type.list_size
    return values.flatten().to_numpy().reshape(n, width).astype(np.float32) if n else np.zeros((0, width), np.float32)
