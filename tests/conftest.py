"""Suite-wide settings.

Torch's intra-op thread pool is pinned to one thread: the suite's tensors are small, and on a
2-core machine shared with other processes, two spinning threads per op made tiny operations
orders of magnitude slower (measured in this repo while building it). Results do not depend on it.

Also: a local S3 server (moto's server mode, on loopback) for the storage and pipeline tests, and
one real PostgreSQL server per session (``postgres_server.py``) for the lineage tests: each test
asking for ``postgres_url`` gets a new empty database on it.

Parallel lanes (``pytest -n 3 --dist loadgroup``, the README's command): the tests that share a
costly session fixture run in one worker, so it is built once (``SHARED_FIXTURE_GROUPS``), and so
do the end-to-end tests of one file that share a module fixture (a module's Ray, a trained
parent); other end-to-end tests go to whichever lane is free, before the short tests; every
Ray a test starts is its own local instance (``address="local"``), and the cluster scripts stop
only their own processes, so tests in different workers never stop or join each other's Ray.
"""
import os
import secrets
import sys
from pathlib import Path

import pytest
import torch

from orchestrator.gc_startup import startup_phase

torch.set_num_threads(1)

# Each local Ray a test starts (in-process or in an `orchestrator run` subprocess, which inherits
# this) would prestart worker processes for its first driver; with the pipeline's runtime
# environment they were never used (seen as IDLE-only processes, 0.6-1 s of CPU each, 2 of 4 per
# instance) on a suite whose two lanes keep both cores busy.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")

# session fixture → the xdist group of every test that uses it (directly or through another fixture);
# tests/pipeline's g0_run is not here: the workers of one run share it through a file lock
SHARED_FIXTURE_GROUPS = {
    "update": "digits-experiment",     # tests/evaluation: every learned method trained once
    "digits_experiment": "digits-experiment",
    "hbct_update": "digits-experiment",
    "ray_address": "tuning",           # tests/tuning: one Ray, one pipeline whose steps the sweeps share
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (its hook has no order)
def pytest_collection_modifyitems(config, items):
    """The xdist group of each test: its session fixture's (``SHARED_FIXTURE_GROUPS``), else for an
    end-to-end test that uses a module fixture (a module's Ray or trained parent, built once) its
    file, else none (the test goes wherever a worker is free)."""
    for item in items:
        groups = {SHARED_FIXTURE_GROUPS[name] for name in item.fixturenames if name in SHARED_FIXTURE_GROUPS}
        if len(groups) > 1:
            raise pytest.UsageError(f"{item.nodeid} uses session fixtures of several groups: {sorted(groups)}")
        if not groups and item.get_closest_marker("e2e") is not None and _uses_module_fixture(item):
            groups = {item.nodeid.split("::", 1)[0]}
        for group in groups:
            item.add_marker(pytest.mark.xdist_group(group))
    # End-to-end tests first (a stable sort: the rest keep their order). pytest-xdist hands out its
    # work units by size, then in this order, so the long single tests start early and the many
    # short ones fill the lanes at the end instead of a lone end-to-end test running last.
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


@pytest.hookimpl(trylast=True)  # after the group's own fixtures were torn down
def pytest_runtest_teardown(item, nextitem):
    """A Ray started in this process (tests/tuning's session Ray is one) stops when the lane moves
    on to another xdist group: a group runs in one lane, all together, so none of its tests is
    left to need it, and the next group may start its own in-process Ray (``ray.init`` refuses a
    second one). Ungrouped tests join whatever Ray is up (``distributed.runtime.connect``)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized() or _group(nextitem) in (None, _group(item)):
        return
    ray.shutdown()


def _group(item) -> str | None:
    marker = item.get_closest_marker("xdist_group") if item is not None else None
    return marker.args[0] if marker is not None else None


def _uses_module_fixture(item) -> bool:
    """Whether the test asks (directly or through other fixtures) for a module-scoped fixture."""
    fixture_defs = getattr(item, "_fixtureinfo", None)
    if fixture_defs is None:
        return False
    return any(definition.scope == "module"
               for definitions in fixture_defs.name2fixturedefs.values() for definition in definitions)


def pytest_configure(config):
    _ensure_ray_token()


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Collection imports the project, torch, Ray and the tests: a start-up phase
    (``orchestrator.gc_startup``), so the garbage collector's passes during the tests do not walk
    all of that again (the fast lane: 193 → 180 s of CPU, one run each)."""
    with startup_phase():
        return (yield)


def _ensure_ray_token() -> None:
    """Ray's token for local clusters (``~/.ray/auth_token``) exists before any test starts Ray. On a
    fresh machine the first ``ray.init`` writes it; two test processes starting their first Ray at
    once would each write one, and the second would lock the first out of its own cluster. Created
    here once (an atomic link: concurrent callers keep the first), never replaced."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    path = Path.home() / ".ray" / "auth_token"
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    candidate = path.with_name(f".auth_token.{os.getpid()}")
    candidate.write_text(secrets.token_hex(32))
    candidate.chmod(0o600)
    try:
        os.link(candidate, path)
    except FileExistsError:
        pass
    finally:
        candidate.unlink()


@pytest.fixture(scope="module")
def moto_endpoint():
    """A moto S3 server on loopback for the module; yields its endpoint URL."""
    from moto_s3 import S3Server

    server = S3Server(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def fake_aws_credentials(monkeypatch, tmp_path):
    """Fake AWS credentials and region in the environment, no AWS config, profile or endpoint of
    the machine's (a test that talks to a moto server names its endpoint itself)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def s3_bucket(moto_endpoint, fake_aws_credentials):
    """A fresh bucket on the moto server, fake credentials in the environment; yields (bucket, endpoint)."""
    import uuid

    import boto3
    import s3fs

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
