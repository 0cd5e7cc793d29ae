"""A request's body as the ingress reads it: bounded in size and in time.

A client that sends its headers and then a body slowly, or never, must not hold what other
requests need. The ingress therefore decides everything it can from the request line and headers
first (route, method, bearer token: ``serving.endpoint.GalleryEndpoint.admit``; the declared
length: ``declared_length``), and only then reads the body, with a deadline (``read_body``;
``Limits.body_timeout_s``). While it waits, such a request holds one coroutine of the ingress
replica, no search thread; when the deadline passes it is answered 408 and Serve's proxy closes
its connection.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable

from orchestrator.serving.requests import BadRequest


def declared_length(content_length: str | None, limit: int) -> int | None:
    """The body length a ``Content-Length`` header declares (None: no header, as with a chunked
    body); BadRequest 413 above ``limit`` bytes, before anything is read, and 400 when it is not a
    decimal number."""
    if content_length is None:
        return None
    text = content_length.strip()
    if not text.isascii() or not text.isdigit():
        raise BadRequest(400, f"Content-Length {content_length[:40]!r} is not a number of bytes")
    if len(text) > len(str(limit)) or int(text) > limit:
        raise BadRequest(413, f"Content-Length {text[:40]}: at most {limit} bytes")
    return int(text)


async def read_body(chunks: AsyncIterable[bytes], limit: int, timeout_s: float) -> bytes:
    """The body from its chunks as they arrive (Starlette's ``Request.stream()``): BadRequest 413
    as soon as more than ``limit`` bytes arrived (a chunked body declares no length), 408 when it
    has not fully arrived within ``timeout_s`` seconds."""
    async def collect() -> bytes:
        parts, size = [], 0
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise BadRequest(413, f"request body of more than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    try:
        return await asyncio.wait_for(collect(), timeout_s)
    except asyncio.TimeoutError:
        raise BadRequest(408, f"request body not received within {timeout_s:g} s") from None
