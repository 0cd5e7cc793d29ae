"""Fixtures of the storage tests: tiny models of several methods, and a local S3 (moto) server."""
import pytest

from storage_cases import CASES, build_case


@pytest.fixture(params=CASES, ids=[case[0] for case in CASES])
def case(request):
    _, name, params, adapters = request.param
    method, model = build_case(name, params, adapters)
    return method, model, adapters


@pytest.fixture(scope="module")
def moto_endpoint():
    """A moto S3 server on loopback for the module; yields its endpoint URL."""
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
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
