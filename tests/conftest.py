"""Suite-wide settings.

Torch's intra-op thread pool is pinned to one thread: the suite's tensors are small, and on a
2-core machine shared with other processes, two spinning threads per op made tiny operations
orders of magnitude slower (measured in this repo while building it). Results do not depend on it.

Also: a local S3 server (moto's server mode, on loopback) for the storage and pipeline tests, and
one real PostgreSQL server per session (``postgres_server.py``) for the lineage tests: each test
asking for ``postgres_url`` gets a new empty database on it.
"""
import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def moto_endpoint():
    """A moto S3 server on loopback for the module; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(moto_endpoint, monkeypatch, tmp_path):
    """A fresh bucket on the moto server, fake credentials in the environment; yields (bucket, endpoint)."""
    import uuid

    import boto3
    import s3fs

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    bucket = f"bucket-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    s3fs.S3FileSystem.clear_instance_cache()
    yield bucket, moto_endpoint
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def postgres_server():
    """The session's PostgreSQL server (started on first use; an error, not a skip, if it cannot)."""
    from postgres_server import PostgresServer

    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server):
    """The SQLAlchemy URL of a new, empty database on the session's PostgreSQL server."""
    return postgres_server.new_database()
