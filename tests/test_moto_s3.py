"""The tests' S3 server applies a conditional PUT atomically (``moto_s3``): of writers racing to
create one key with ``If-None-Match: *``, exactly one succeeds, as on S3. Moto's check reads the
key first (``S3Backend.get_object``); the test makes that read slow, so every racing writer has
checked before any has written (moto's own server then lets all six create the key)."""
from __future__ import annotations

import threading
import time

import boto3
import pytest
from botocore.exceptions import ClientError

from moto_s3 import S3Server


def _racing_creations(endpoint: str, keys: int, writers: int) -> list[int]:
    """Per key, how many of ``writers`` threads (released together) created it."""
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    client.create_bucket(Bucket="race")
    created = [0] * keys
    refusals: list[str] = []
    lock = threading.Lock()

    def write(key: int, gate: threading.Barrier) -> None:
        gate.wait()
        try:
            client.put_object(Bucket="race", Key=f"k{key}", Body=b"x" * 1000, IfNoneMatch="*")
        except ClientError as refused:  # recorded here, asserted by the caller (a thread's assert fails nothing)
            with lock:
                refusals.append(refused.response["Error"]["Code"])
            return
        with lock:
            created[key] += 1

    for key in range(keys):
        gate = threading.Barrier(writers)
        threads = [threading.Thread(target=write, args=(key, gate)) for _ in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert set(refusals) <= {"PreconditionFailed"}, refusals
    assert sum(created) + len(refusals) == keys * writers  # every writer either created its key or was refused
    return created


@pytest.mark.e2e
def test_of_writers_racing_to_create_a_key_exactly_one_succeeds(monkeypatch):
    from moto.s3.models import S3Backend

    get_object = S3Backend.get_object

    def slow_get_object(self, *args, **kwargs):
        found = get_object(self, *args, **kwargs)
        time.sleep(0.05)
        return found

    monkeypatch.setattr(S3Backend, "get_object", slow_get_object)
    server = S3Server(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        assert _racing_creations(f"http://{host}:{port}", keys=5, writers=6) == [1] * 5
    finally:
        server.stop()
