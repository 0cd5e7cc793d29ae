"""Store locations as the lineage records them, and the connection rules of database stores.

A shard held by a store other than the shard files is recorded in the lineage under a *location
URI* in the shard's ``index_uri`` (where a shard-file gallery records its FAISS index file):

* pgvector: ``pgvector:<database URL>#table=<table>&shard=<n>&version=<v>``, the URL as the
  gallery's ``store.url`` gives it (``postgresql://user@host:port/db?host=…``: never a password;
  libpq takes it from ``PGPASSWORD`` or ``~/.pgpass``);
* lance: ``lance:<dataset folder>#shard=<n>&version=<v>``.

``version`` names the rows of one write of one shard: the first 20 hex characters of the digest of
its ids and vector bytes (``stores.vectors.rows_digest``), so a retried write of the same rows has
the same name. Nothing here imports Ray, torch or a database driver.
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit

from orchestrator.storage.filesystem import redact_uri

STORE_SCHEMES = ("pgvector", "lance")


def password_in_url(url: str) -> bool:
    """Whether a database URL carries a password (``user:password@`` or ``?password=``)."""
    parts = urlsplit(url)
    return parts.password is not None or any(k.lower() == "password" for k, _ in parse_qsl(parts.query))


def postgres_url_problem(url: str) -> str | None:
    """Why ``url`` is not a PostgreSQL URL a store can use (None: it is)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres", "postgresql+psycopg"):
        return "a PostgreSQL URL: postgresql://user@host:port/database"
    if not parts.path.strip("/"):
        return "name the database: postgresql://user@host:port/database"
    if "#" in url:
        return "no '#' in the URL"
    return None


def libpq_url(url: str) -> str:
    """The URL as libpq takes it (SQLAlchemy's ``postgresql+psycopg://`` spelled ``postgresql://``)."""
    return "postgresql://" + url.split("://", 1)[1]


def shown(url: str) -> str:
    """A URL as it may be printed: a password (there should be none) replaced by ``***``, secret
    query parameters too; the user name kept (it says who connects)."""
    parts = urlsplit(url)
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
        url = parts._replace(netloc=netloc).geturl()
    if parts.username is not None and parts.password is None:
        return url.split("@", 1)[0] + "@" + redact_uri(url.split("@", 1)[1])
    return redact_uri(url)


def is_store_uri(uri: str | None) -> bool:
    """Whether ``uri`` is a store location (not a file)."""
    return isinstance(uri, str) and uri.split(":", 1)[0] in STORE_SCHEMES and "#" in uri


@dataclass(frozen=True)
class StoreLocation:
    """A parsed location URI: the store's scheme, where it is (database URL or dataset folder),
    the table (pgvector), and the shard's rows (``shard``, ``version``)."""

    scheme: str
    where: str
    shard: int
    version: str
    table: str | None = None

    @classmethod
    def parse(cls, uri: str) -> StoreLocation:
        if not is_store_uri(uri):
            raise ValueError(f"not a store location: {shown(uri)}")
        scheme, rest = uri.split(":", 1)
        where, _, fragment = rest.rpartition("#")
        fields = dict(parse_qsl(fragment))
        try:
            return cls(scheme, where, int(fields["shard"]), fields["version"], fields.get("table"))
        except (KeyError, ValueError):
            raise ValueError(f"store location without shard and version: {shown(uri)}") from None

    @property
    def uri(self) -> str:
        fields = ({"table": self.table} if self.table else {}) | {"shard": self.shard, "version": self.version}
        return f"{self.scheme}:{self.where}#{urlencode(fields)}"

    def describe(self) -> str:
        """One phrase naming the rows (no password)."""
        table = f" table {self.table}" if self.table else ""
        return f"{self.scheme} store {shown(self.where)}{table} shard {self.shard} version {self.version}"
