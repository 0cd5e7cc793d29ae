"""The ingress's body reading: the declared length refused before anything is read, the body bounded
in bytes (also when chunked, with no length declared) and in time."""
import asyncio

import pytest

from orchestrator.serving.bodies import declared_length, read_body
from orchestrator.serving.requests import BadRequest


@pytest.mark.parametrize("header, status, words", [
    ("1025", 413, "Content-Length 1025: at most 1024 bytes"),
    ("999999999999999999999999999999", 413, "at most 1024 bytes"),
    ("12abc", 400, "'12abc' is not a number of bytes"),
    ("-1", 400, "not a number"),
    ("\u0661\u0662", 400, "not a number"),  # Arabic-Indic digits: str.isdigit, not a length
])
def test_a_declared_length_is_refused_from_the_header(header, status, words):
    with pytest.raises(BadRequest, match=words) as refused:
        declared_length(header, 1024)
    assert refused.value.status == status


def test_a_declared_length_within_the_limit_or_none_is_accepted():
    assert declared_length("1024", 1024) == 1024 and declared_length(" 7 ", 1024) == 7
    assert declared_length(None, 1024) is None


async def chunks(*parts: bytes, then_wait: bool = False):
    for part in parts:
        yield part
    if then_wait:  # a client that stops sending
        await asyncio.sleep(3600)


def test_a_body_is_read_whole_within_its_limits():
    assert asyncio.run(read_body(chunks(b'{"k"', b": 1}"), 1024, 1.0)) == b'{"k": 1}'


def test_a_body_over_the_limit_is_refused_once_the_limit_is_passed():
    with pytest.raises(BadRequest, match="more than 8 bytes") as refused:
        asyncio.run(read_body(chunks(b"12345", b"67890", then_wait=True), 8, 60.0))
    assert refused.value.status == 413


def test_a_body_that_stops_arriving_is_refused_at_its_deadline():
    async def timed():
        start = asyncio.get_running_loop().time()
        with pytest.raises(BadRequest, match=r"not received within 0.2 s") as refused:
            await read_body(chunks(b'{"images": [', then_wait=True), 1024, 0.2)
        return refused.value.status, asyncio.get_running_loop().time() - start

    status, waited = asyncio.run(timed())
    assert status == 408 and 0.2 <= waited < 1.0
