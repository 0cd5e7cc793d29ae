"""The pgvector store: a gallery's vectors in PostgreSQL tables with the ``vector`` extension.

What it creates in the database (nothing else; docs/stores.md): the ``vector`` extension when it
is missing (``CREATE EXTENSION IF NOT EXISTS vector``: the user needs that right, or a DBA creates
it once), and per generation of the gallery one table ``<table>__<generation>``::

    shard integer, version text, id bigint, label bigint, embedding vector(D'), uri text,
    PRIMARY KEY (shard, version, id)

(with an approximate index over a hyperbolic gallery, also ``search vector(D'+1)``: the rows'
MIPS→L2 search coordinates, ``stores.vectors``; with a binary ``gallery.index`` kind, also ``code
bit(8C)``: the rows' bit-plane codes, ``stores.bits``, searched by Hamming distance ``<~>``; in a
non-Euclidean gallery, also ``raw vector(D)``: the raw embeddings a forward path maps through F;
``stores.vectors.row_columns``) and,
when ``store.index`` says so, one approximate index (``hnsw`` or ``ivfflat``) *per shard update*
(``index_name``): a partial index ``WHERE shard = s AND version = 'v'`` over that update's rows,
built at once after they are written (IVFFlat trains its lists on them), on the column the search
ranks by: ``embedding`` with ``vector_l2_ops`` (euclidean) or ``vector_ip_ops`` (cosine),
``search`` with ``vector_ip_ops`` (hyperbolic; ``stores.vectors.search_metric``), ``code`` with
``bit_hamming_ops`` (binary kinds); an update of fewer than ``MIN_INDEX_ROWS`` rows gets none (an
exact scan of its rows). One index over the whole table, walked under the ``(shard, version)``
filter, recalled 0.51–0.66 of the exact top-10 at 10⁵ points in 8 shards (HNSW, any ``ef_search``
below 800, iterative scans on): the filter passes 1 row in 8, so the graph walk reaches too few of
the shard's rows; a shard's own graph recalls 0.996 at ``ef_search`` 40, 7× faster (docs/stores.md).
It never touches another table, and within its tables only the rows (and their indexes) of the
versions it wrote.

Writes: a worker writes one shard update's rows in one transaction (``COPY … FROM STDIN`` in
PostgreSQL's binary format), under the version that names them (the digest of its ids and
vectors): they appear all at once or not at all, and a retry of the same rows replaces them in one
transaction. No query reaches them until the lineage commit names ``(shard, version)``: every
search filters on the versions the lineage (or the deployment, or the server's snapshot) names.

Connection: the store's URL as the lineage takes it (never a password: PGPASSWORD or
``~/.pgpass``, which libpq reads); a failure to connect or a connection lost is
``StoreUnavailable``: one line naming the store and its location, the CLI's exit code 6.
"""
from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from orchestrator.errors import OutsideSystemError, one_line
from orchestrator.integrity import ids_sha256
from orchestrator.stores.bits import bit_strings, candidates_per_query, code_distances, codes_of_bit_strings, query_codes, shard_codes
from orchestrator.stores.locations import StoreLocation, libpq_url, shown
from orchestrator.stores.vectors import (
    EarlierLayout,
    check_layout,
    check_servable,
    check_stored_rows,
    nearest,
    query_coordinates,
    rerank,
    row_columns,
    rows_digest,
    search_metric,
    shard_columns,
    stored_coordinates,
)

_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
VERSION_CHARS = 20
CONNECT_TIMEOUT_S = 10
_READERS: dict[str, Any] = {}  # database URL → this process's reading connection
#: pgvector's operator and operator class per metric (``stores.vectors.search_metric``; ``hamming``: codes).
_OPERATORS = {"l2": ("<->", "vector_l2_ops"), "dot": ("<#>", "vector_ip_ops"), "hamming": ("<~>", "bit_hamming_ops")}
#: Rows a shard update needs for an approximate index of its own (fewer: exact scans of its rows).
MIN_INDEX_ROWS = 1000


class StoreUnavailable(OutsideSystemError):
    """The store's database did not answer or dropped the connection (picklable, as every
    ``OutsideSystemError``: it crosses from a Ray worker to the driver)."""


def table_name(prefix: str, generation: str) -> str:
    """``<prefix>__<generation>``: lower-case letters, digits and ``_``; a generation name that
    needs changing for that (or is long) gets 8 hex characters of its hash, so two never share a table."""
    clean = re.sub(r"[^a-z0-9_]", "_", generation.lower())
    if clean != generation or len(prefix) + 2 + len(clean) > 63:
        clean = f"{clean[:63 - len(prefix) - 12]}_{hashlib.sha256(generation.encode()).hexdigest()[:8]}"
    return f"{prefix}__{clean}"


def index_name(location: StoreLocation, index: str) -> str:
    """The name of the approximate ``index`` (``hnsw``/``ivfflat``) of the rows at ``location``:
    ``<table>_<shard>_<version>_<index>``, the table's name cut to fit PostgreSQL's 63 characters."""
    tail = f"_{location.shard}_{location.version[:12]}_{index}"
    return f"{location.table[:63 - len(tail)]}{tail}"


@dataclass(frozen=True)
class PgVectorStore:
    """A gallery's pgvector tables (module docstring): ``url`` (no password), ``prefix`` (the
    tables' name prefix), ``index`` (``exact``/``hnsw``/``ivfflat``) and its options,
    ``overfetch`` (candidates per hit re-ranked exactly); ``binary``: the ``gallery.index`` binary
    kind whose codes the rows carry and are searched by (``stores.bits``), with its options."""

    url: str
    prefix: str
    index: str = "exact"
    index_options: Mapping[str, Any] = field(default_factory=dict)
    overfetch: int = 4
    binary: str | None = None
    binary_options: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "pgvector"

    def searched_column(self, space: str) -> tuple[str, str]:
        """(column, metric) the rows of a ``space`` gallery are searched by: ``code`` by Hamming
        distance (binary kinds), else ``stores.vectors.search_metric``."""
        return ("code", "hamming") if self.binary else search_metric(space, self.index)

    def describe(self) -> str:
        return f"pgvector store {shown(self.url)} (tables {self.prefix}__*)"

    # -- connections ----------------------------------------------------------------------------
    @contextmanager
    def connect(self) -> Iterator[Any]:
        """A psycopg connection (committed on leaving, rolled back on an error); a database that
        does not answer or drops the connection raises ``StoreUnavailable``."""
        import psycopg

        try:
            with psycopg.connect(libpq_url(self.url), connect_timeout=CONNECT_TIMEOUT_S) as connection:
                yield connection
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            if isinstance(error, psycopg.errors.QueryCanceled):
                raise
            raise self.unavailable(error) from None

    @contextmanager
    def reading(self) -> Iterator[Any]:
        """A transaction on this process's reading connection to the store (opened once, kept for
        the searches that follow: a server searches many times a second); a lost connection is
        dropped (the next search opens a new one) and raises ``StoreUnavailable``."""
        import psycopg

        connection = _READERS.get(self.url)
        try:
            if connection is None or connection.closed:
                connection = _READERS[self.url] = psycopg.connect(libpq_url(self.url), autocommit=True,
                                                                  connect_timeout=CONNECT_TIMEOUT_S)
            with connection.transaction():
                yield connection
        except (psycopg.OperationalError, psycopg.InterfaceError) as error:
            _READERS.pop(self.url, None)
            if isinstance(error, psycopg.errors.QueryCanceled):
                raise
            raise self.unavailable(error) from None

    def unavailable(self, error: BaseException) -> StoreUnavailable:
        return StoreUnavailable("PostgreSQL (pgvector store)", shown(self.url), one_line(error),
                                "that the server runs and accepts this user (PGPASSWORD or ~/.pgpass; never a "
                                "password in the URL), and the database exists; a re-run resumes the backfill")

    def check_reachable(self) -> None:
        with self.connect() as connection:
            connection.execute("SELECT 1")

    # -- tables ---------------------------------------------------------------------------------
    def _ensure_table(self, connection, table: str, columns: dict[str, np.ndarray]) -> None:
        """Create ``table`` with the vector ``columns`` (column → its (N, width) values) unless it
        exists; ``EarlierLayout`` when it exists without one of them (written by an earlier layout)."""
        from psycopg import sql

        connection.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"orchestrator-store:{table}",))
        if connection.execute("SELECT to_regclass(%s)", (f'"{table}"',)).fetchone()[0] is not None:
            missing = [column for column in columns if column not in self.table_columns(connection, table)]
            if missing:
                raise EarlierLayout(f"pgvector store {shown(self.url)} table {table}: written by an earlier layout "
                                    f"without the column(s) {', '.join(missing)} (or with another store.index); run "
                                    "`orchestrator verify FILE --migrate-stores` to add and fill them in place, then re-run")
            return
        if connection.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
            connection.execute("SELECT pg_advisory_xact_lock(hashtext('orchestrator-store:vector-extension'))")
            connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
        defined = sql.SQL("").join(sql.SQL("{} {} NOT NULL, ").format(sql.Identifier(column),
                                                                       _column_type(column, values.shape[1]))
                                   for column, values in columns.items())
        connection.execute(sql.SQL("CREATE TABLE {} (shard integer NOT NULL, version text NOT NULL, id bigint NOT NULL, "
                                   "label bigint NOT NULL, {}uri text, PRIMARY KEY (shard, version, id))")
                           .format(sql.Identifier(table), defined))

    @staticmethod
    def table_columns(connection, table: str) -> set[str]:
        """The names of ``table``'s columns."""
        return {row[0] for row in connection.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND "
            "table_name = %s", (table,)).fetchall()}

    def build_index(self, connection, location: StoreLocation, space: str) -> bool:
        """Create the approximate index (``store.index``) of the rows at ``location`` unless it
        exists: a partial index over exactly them, built at once (IVFFlat: ``lists`` trained on them,
        default ``sqrt(N)``); True if created. Searches name ``shard`` and ``version`` as literals,
        so the planner matches its predicate."""
        from psycopg import sql

        name = index_name(location, self.index)
        if self.index == "exact" or connection.execute("SELECT to_regclass(%s)", (f'"{name}"',)).fetchone()[0]:
            return False
        column, metric = self.searched_column(space)
        options = dict(self.index_options)
        if self.index == "hnsw":
            method = sql.SQL("hnsw ({} {}) WITH (m = {}, ef_construction = {})").format(
                sql.Identifier(column), sql.SQL(_OPERATORS[metric][1]), sql.Literal(int(options.get("m", 16))),
                sql.Literal(int(options.get("ef_construction", 64))))
        else:
            n = self.count(location.uri)
            method = sql.SQL("ivfflat ({} {}) WITH (lists = {})").format(
                sql.Identifier(column), sql.SQL(_OPERATORS[metric][1]),
                sql.Literal(int(options.get("lists", max(1, min(4096, int(round(np.sqrt(n)))))))))
        connection.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} USING {} WHERE shard = {} AND version = {}")
                           .format(sql.Identifier(name), sql.Identifier(location.table), method,
                                   sql.Literal(location.shard), sql.Literal(location.version)))
        connection.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(location.table)))  # the planner's statistics
        return True

    def tables(self, connection) -> list[str]:
        rows = connection.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND "
                                  "tablename LIKE %s", (self.prefix.replace("_", r"\_") + r"\_\_%",)).fetchall()
        return sorted(row[0] for row in rows)

    def _location(self, uri: str) -> StoreLocation:
        location = StoreLocation.parse(uri)
        if location.scheme != "pgvector" or location.table is None:
            raise ValueError(f"not a pgvector location: {shown(uri)}")
        return location

    # -- the protocol ---------------------------------------------------------------------------
    def write_shard(self, shard_index: int, shard, key: str, first_attempt: bool) -> tuple[str, dict[str, Any]]:
        from psycopg import sql

        from orchestrator.storage.overwrite import UnknownArtefact

        vectors = stored_coordinates(shard.embeddings, shard.space, shard.curv)
        names = row_columns(shard.space, self.index, self.binary is not None)
        codes = codes_record = None
        if "code" in names:
            codes, codes_record = shard_codes(shard.embeddings, shard.space, shard.curv, self.binary, self.binary_options)
        columns = shard_columns(shard.embeddings, vectors, names, codes)
        digest = rows_digest(shard.ids, *columns.values())
        table = table_name(self.prefix, shard.generation)
        location = StoreLocation("pgvector", self.url, int(shard_index), digest[:VERSION_CHARS], table)
        attributes = shard.attributes
        uris = attributes.column("uri").to_pylist() if attributes is not None and "uri" in attributes.column_names else None
        data = _copy_rows(int(shard_index), location.version, shard.ids, shard.labels, columns, uris)
        with self.connect() as connection:
            self._ensure_table(connection, table, columns)
            where = sql.SQL("WHERE shard = {} AND version = {}").format(sql.Literal(location.shard),
                                                                         sql.Literal(location.version))
            connection.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (location.uri,))
            there = connection.execute(sql.SQL("SELECT 1 FROM {} ").format(sql.Identifier(table)) + where +
                                       sql.SQL(" LIMIT 1")).fetchone()
            if there is not None:
                if first_attempt:
                    raise UnknownArtefact(f"{key}: {location.describe()} already holds rows, although the step is on "
                                          "its first attempt (so no earlier attempt wrote them and the lineage does not "
                                          "know them); refusing to replace them")
                connection.execute(sql.SQL("DELETE FROM {} ").format(sql.Identifier(table)) + where)
            listed = sql.SQL(", ").join(sql.Identifier(name) for name in ["shard", "version", "id", "label", *columns, "uri"])
            with connection.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
                    sql.Identifier(table), listed)) as copy:
                copy.write(data)
        if self.index != "exact" and len(shard.ids) >= MIN_INDEX_ROWS:  # the update's own index (its own transaction)
            with self.connect() as connection:
                self.build_index(connection, location, shard.space)
        return location.uri, {"kind": "pgvector", "sha256": digest, "ids_sha256": ids_sha256(shard.ids),
                              "n_items": int(len(shard.ids)), "space": shard.space, "curv": float(shard.curv),
                              "dim": int(np.asarray(shard.embeddings).shape[1]), "index": self.index,
                              "index_options": dict(self.index_options), "overfetch": int(self.overfetch),
                              "columns": names, **({"binary": codes_record} if codes_record else {})}

    def count(self, uri: str) -> int:
        from psycopg import sql

        location = self._location(uri)
        with self.connect() as connection:
            if connection.execute("SELECT to_regclass(%s)", (f'"{location.table}"',)).fetchone()[0] is None:
                return 0
            return int(connection.execute(sql.SQL("SELECT count(*) FROM {} WHERE shard = %s AND version = %s")
                                          .format(sql.Identifier(location.table)),
                                          (location.shard, location.version)).fetchone()[0])

    def read_rows(self, uri: str, columns: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(ids (N,) int64 ascending, column → its (N, ·) values in that order: float32 vectors,
        uint8 codes) of the rows at ``uri``."""
        from psycopg import sql

        location = self._location(uri)
        with self.connect() as connection:
            if connection.execute("SELECT to_regclass(%s)", (f'"{location.table}"',)).fetchone()[0] is None:
                return np.zeros(0, np.int64), {column: np.zeros((0, 0), np.float32) for column in columns}
            buffer = bytearray()
            listed = sql.SQL(", ").join(sql.Identifier(name) for name in ["id", *columns])
            with connection.cursor().copy(sql.SQL("COPY (SELECT {} FROM {} WHERE shard = {} AND version = {} "
                                                  "ORDER BY id) TO STDOUT (FORMAT BINARY)")
                                          .format(listed, sql.Identifier(location.table), sql.Literal(location.shard),
                                                  sql.Literal(location.version))) as copy:
                for chunk in copy:
                    buffer += chunk
        return _parse_rows(bytes(buffer), ["code" if column == "code" else "vector" for column in columns], columns)

    def open_shard(self, uri: str, record: Mapping[str, Any] | None, n_items: int | None = None):
        held = self.count(uri)
        where = StoreLocation.parse(uri).describe()
        check_servable(where, record, held)
        searched = "code" if record.get("binary") else search_metric(record["space"], record.get("index", "exact"))[0]
        check_layout(where, record, [searched], "the column its search ranks by")
        return PgVectorShard(self, uri, dict(record), held)

    def check_shard(self, uri: str, record: Mapping[str, Any] | None, n_items: int | None = None) -> None:
        check_stored_rows(self, uri, self._location(uri).describe(), record)

    def add_columns(self, table: str, locations: list[tuple[str, np.ndarray, dict[str, np.ndarray]]],
                    space: str) -> None:
        """``stores.migrate``: add the columns ``locations`` ((location URI, its ids ascending,
        column → (N, ·) values)) carry to ``table`` (nullable: rows no location names get none),
        fill each location's rows in one transaction, and replace the earlier layout's index over the
        whole table (on ``embedding`` in a hyperbolic gallery) by each location's own (``build_index``)."""
        from psycopg import sql

        widths = {column: values.shape[1] for _uri, _ids, added in locations for column, values in added.items()}
        with self.connect() as connection:
            held = self.table_columns(connection, table)
            for column, width in widths.items():
                if column not in held:
                    connection.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                        sql.Identifier(table), sql.Identifier(column), _column_type(column, width)))
        for uri, ids, added in locations:
            location = self._location(uri)
            names = [sql.Identifier(column) for column in added]
            with self.connect() as connection:
                connection.execute(sql.SQL("CREATE TEMPORARY TABLE migrated ON COMMIT DROP AS SELECT shard, version, id, "
                                           "label, {}, uri FROM {} LIMIT 0").format(sql.SQL(", ").join(names),
                                                                                   sql.Identifier(table)))
                with connection.cursor().copy("COPY migrated FROM STDIN (FORMAT BINARY)") as copy:
                    copy.write(_copy_rows(location.shard, location.version, ids, np.zeros(len(ids), np.int64), added, None))
                connection.execute(sql.SQL("UPDATE {} AS t SET {} FROM migrated AS m WHERE t.shard = m.shard AND "
                                           "t.version = m.version AND t.id = m.id").format(
                    sql.Identifier(table), sql.SQL(", ").join(sql.SQL("{} = m.{}").format(name, name) for name in names)))
        if self.index != "exact":  # the earlier layout's one index over the table, replaced by each update's own
            with self.connect() as connection:
                connection.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(f"{table}_{self.index}")))
            for uri, ids, _added in locations:
                if len(ids) >= MIN_INDEX_ROWS:
                    with self.connect() as connection:
                        self.build_index(connection, self._location(uri), space)

    def locations(self) -> list[str]:
        from psycopg import sql

        found = []
        with self.connect() as connection:
            for table in self.tables(connection):
                for shard, version in connection.execute(sql.SQL("SELECT DISTINCT shard, version FROM {}")
                                                         .format(sql.Identifier(table))).fetchall():
                    found.append(StoreLocation("pgvector", self.url, int(shard), version, table).uri)
        return sorted(found)

    def remove(self, uris: Iterable[str]) -> None:
        from psycopg import sql

        with self.connect() as connection:
            for uri in uris:
                location = self._location(uri)
                connection.execute(sql.SQL("DELETE FROM {} WHERE shard = %s AND version = %s")
                                   .format(sql.Identifier(location.table)), (location.shard, location.version))
                for index in ("hnsw", "ivfflat"):  # its own index, whichever store.index wrote it
                    connection.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(index_name(location, index))))


class PgVectorShard:
    """One shard's rows in a pgvector table, searched as the router searches a shard index:
    ``overfetch · k`` candidates from the table (its exact scan or its approximate index), re-ranked
    with the space's exact distance (``stores.vectors``)."""

    def __init__(self, store: PgVectorStore, uri: str, record: dict[str, Any], n_rows: int):
        self.store, self.uri, self.record = store, uri, record
        self.location = store._location(uri)
        self.space, self.curv, self.dim = record["space"], float(record["curv"]), int(record["dim"])
        self.kind = (record["binary"]["kind"] if record.get("binary") else  # its distances' unit (router)
                     {"hnsw": "hnsw", "ivfflat": "ivf"}.get(record.get("index", "exact"), "flat"))
        self._ntotal = n_rows

    @property
    def ntotal(self) -> int:
        return self._ntotal

    def search(self, queries, k: int) -> tuple[np.ndarray, np.ndarray]:
        from psycopg import sql

        queries = np.asarray(queries, dtype=np.float64)
        index = self.record.get("index", "exact")
        codes = self.record.get("binary")
        coords, searched = query_coordinates(queries, self.space, self.curv, index)
        if codes:  # bit-plane codes by Hamming distance (stores.bits)
            searched = query_codes(queries, self.space, self.curv, codes)
            texts, cast = bit_strings(searched), sql.SQL("bit({})").format(sql.Literal(8 * searched.shape[1]))
            fetch, (column, metric) = candidates_per_query(codes, k, self.ntotal), ("code", "hamming")
            returned = "code" if codes["rerank"] != "float" else "embedding"
        else:
            texts, cast = [_vector_text(row) for row in searched], sql.SQL("vector")
            fetch, (column, metric) = max(k, min(self.ntotal, k * self.store.overfetch)), search_metric(self.space, index)
            returned = "embedding"
        order = sql.SQL("{} {} q.v::{}").format(sql.Identifier(column), sql.SQL(_OPERATORS[metric][0]), cast)
        query = sql.SQL("SELECT q.n, t.id, t.distance, t.returned::text FROM unnest(%s::text[]) WITH ORDINALITY AS "
                        "q(v, n) CROSS JOIN LATERAL (SELECT id, {} AS returned, {} AS distance FROM {} "
                        "WHERE shard = {} AND version = {} ORDER BY {} LIMIT %s) t").format(
            sql.Identifier(returned), order, sql.Identifier(self.location.table), sql.Literal(self.location.shard),
            sql.Literal(self.location.version), order)  # ::text of the hits only; literals match a partial index
        options = dict(self.store.index_options)
        with self.store.reading() as connection:
            if index == "hnsw":
                connection.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(
                    sql.Literal(int(options.get("ef_search", max(40, fetch))))))
                connection.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
            elif index == "ivfflat":
                connection.execute(sql.SQL("SET LOCAL ivfflat.probes = {}").format(
                    sql.Literal(int(options.get("probes", 10)))))
                connection.execute("SET LOCAL ivfflat.iterative_scan = relaxed_order")
            rows = connection.execute(query, (texts, fetch)).fetchall()
        numbers = np.array([row[0] for row in rows], dtype=np.int64) - 1
        items = np.array([row[1] for row in rows], dtype=np.int64)
        per_query = [numbers == q for q in range(len(queries))]
        if returned == "code":
            found = codes_of_bit_strings([row[3] for row in rows], searched.shape[1])
            hamming = np.array([row[2] for row in rows], dtype=np.float64)
            return nearest([items[mine] for mine in per_query],
                           [code_distances(searched[q], found[mine], hamming[mine], codes)
                            for q, mine in enumerate(per_query)], k)
        width = coords.shape[1]
        vectors = (np.array(",".join(row[3][1:-1] for row in rows).split(","), dtype=np.float32)
                   .reshape(len(rows), width) if rows else np.zeros((0, width), np.float32))
        return rerank(coords, [items[mine] for mine in per_query], [vectors[mine] for mine in per_query], k,
                      self.space, self.curv)


def _vector_text(row: np.ndarray) -> str:
    return "[" + ",".join(repr(float(v)) for v in row.astype(np.float32)) + "]"


def _column_type(column: str, width: int):
    """The SQL type of a vector column of ``width`` values (``code``: ``width`` bytes of bits)."""
    from psycopg import sql

    return sql.SQL("bit({})" if column == "code" else "vector({})").format(sql.Literal(8 * width if column == "code" else width))


def _copy_rows(shard: int, version: str, ids: np.ndarray, labels: np.ndarray, columns: Mapping[str, np.ndarray],
               uris: list[str | None] | None) -> bytes:
    """The rows in PostgreSQL's binary COPY format: (shard, version, id, label, the vector
    ``columns`` in order, uri); ``code`` holds uint8 packed bits (a ``bit``), the others float32
    (a ``vector``)."""
    n = len(ids)
    version_bytes = version.encode()
    fields = [("fields", ">i2"), ("l_shard", ">i4"), ("shard", ">i4"), ("l_version", ">i4"),
              ("version", f"S{len(version_bytes)}"), ("l_id", ">i4"), ("id", ">i8"), ("l_label", ">i4"),
              ("label", ">i8")]
    for position, (column, values) in enumerate(columns.items()):
        width = values.shape[1]
        if column == "code":  # bit: its length in bits, then the bytes
            fields += [(f"l{position}", ">i4"), (f"size{position}", ">i4"), (f"v{position}", "u1", (width,))]
        else:  # vector: its dimension, a reserved int16, then the floats
            fields += [(f"l{position}", ">i4"), (f"size{position}", ">i2"), (f"unused{position}", ">i2"),
                       (f"v{position}", ">f4", (width,))]
    fixed = np.dtype(fields)
    rows = np.zeros(n, dtype=fixed)
    rows["fields"], rows["l_shard"], rows["shard"] = 5 + len(columns), 4, shard
    rows["l_version"], rows["version"] = len(version_bytes), version_bytes
    rows["l_id"], rows["id"] = 8, np.asarray(ids, dtype=np.int64)
    rows["l_label"], rows["label"] = 8, np.asarray(labels, dtype=np.int64)
    for position, (column, values) in enumerate(columns.items()):
        width = values.shape[1]
        code = column == "code"
        rows[f"l{position}"] = 4 + width if code else 4 + 4 * width
        rows[f"size{position}"], rows[f"v{position}"] = 8 * width if code else width, values
    raw = rows.tobytes()
    size = fixed.itemsize
    parts = [_COPY_HEADER]
    for i in range(n):
        parts.append(raw[i * size:(i + 1) * size])
        uri = None if uris is None else uris[i]
        if uri is None:
            parts.append(b"\xff\xff\xff\xff")
        else:
            encoded = uri.encode()
            parts.append(struct.pack(">i", len(encoded)) + encoded)
    parts.append(_COPY_TRAILER)
    return b"".join(parts)


def _parse_rows(data: bytes, kinds: list[str], names: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Binary COPY of (id bigint, then one ``vector`` or ``code`` (bit) field per ``kinds``) rows →
    (ids, name → float32 vectors or uint8 codes); every row has the first row's widths."""
    body = data[len(_COPY_HEADER):len(data) - len(_COPY_TRAILER)]
    if not body:
        return np.zeros(0, np.int64), {name: np.zeros((0, 0), np.float32) for name in names}
    fields = [("fields", ">i2"), ("l_id", ">i4"), ("id", ">i8")]
    at = 2 + 4 + 8
    for position, kind in enumerate(kinds):
        length = struct.unpack(">i", body[at:at + 4])[0]
        if kind == "code":
            fields += [(f"l{position}", ">i4"), (f"size{position}", ">i4"), (f"v{position}", "u1", (length - 4,))]
        else:
            fields += [(f"l{position}", ">i4"), (f"size{position}", ">i2"), (f"unused{position}", ">i2"),
                       (f"v{position}", ">f4", ((length - 4) // 4,))]
        at += 4 + length
    rows = np.frombuffer(body, dtype=np.dtype(fields))
    return rows["id"].astype(np.int64), {
        name: np.ascontiguousarray(rows[f"v{position}"].astype(np.uint8 if kind == "code" else np.float32))
        for position, (kind, name) in enumerate(zip(kinds, names))}
