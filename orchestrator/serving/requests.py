"""The body of ``POST /search``, read and bounded before any model or index sees it.

A JSON object with exactly one of:

- ``"embeddings"``: a list of Q lists of D numbers, embeddings of the serving generation (D: its
  embedding width; NaN or infinite values are refused); or an object of such lists keyed by
  generation name, the same Q queries embedded by the serving generation and by each generation a
  spherical interpolation path needs (``slerp``: the old generation's embedding of the query),
  exactly those;
- ``"images"``: a list of Q strings, each an encoded image file (PNG, JPEG, …) in base64;
- ``"uris"``: a list of Q image locations, each under one of the prefixes the server was started
  with (``--read-prefix``); nothing else is read, so a request cannot make the server fetch an
  arbitrary location;

and optionally ``"k"`` (hits per query, 1…``max_k``, default 10) and ``"generation"`` (whose queries
search; default the deployed one). Every refusal is a ``BadRequest`` with an HTTP status and a
one-line reason naming the field and the value: whatever the body holds (nesting thousands deep,
numbers of thousands of digits, UTF-16 or invalid UTF-8, lone surrogates, values of the wrong type),
it is a ``BadRequest``, never another exception.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import re
import reprlib
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.errors import UsageError
from orchestrator.search.query_generations import split_by_generation
from orchestrator.serving.settings import Limits

QUERY_FIELDS = ("embeddings", "images", "uris")
DEFAULT_K = 10
#: The longest reason a refusal gives (it may quote what the client sent).
MAX_REASON = 300
#: The longest generation name a request may give.
MAX_NAME = 256
_TERMINAL_CODE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def _quoting() -> reprlib.Repr:
    """A ``repr`` of what a client sent, bounded in depth and length however large or deep it is."""
    quote = reprlib.Repr()
    quote.maxlevel, quote.maxlist, quote.maxdict = 2, 4, 4
    quote.maxstring = quote.maxlong = quote.maxother = 40
    return quote


_QUOTE = _quoting()


class BadRequest(UsageError, ValueError):
    """A request the server refuses: ``status`` (4xx) and a ``reason`` of one line, at most
    ``MAX_REASON`` characters, without control characters (no terminal codes)."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, one_line(reason)


def one_line(text: str) -> str:
    """``text`` on one line: terminal colour codes and other control characters dropped,
    whitespace runs as one space, lone surrogates (from JSON ``\\ud800``) as U+FFFD, cut to
    ``MAX_REASON`` characters."""
    printable = "".join("\ufffd" if unicodedata.category(c) == "Cs" else c for c in _TERMINAL_CODE.sub("", text)
                        if unicodedata.category(c) != "Cc" or c.isspace())
    line = " ".join(printable.split())
    return line if len(line) <= MAX_REASON else line[:MAX_REASON - 1] + "…"


@dataclass(frozen=True)
class SearchRequest:
    """Exactly one of ``embeddings`` (Q, D) float32, ``images`` (encoded bytes) or ``uris``."""

    k: int
    generation: str | None
    embeddings: np.ndarray | None = None
    images: tuple[bytes, ...] | None = None
    uris: tuple[str, ...] | None = None
    embeddings_by_generation: dict[str, np.ndarray] | None = None
    """``embeddings`` given as an object: generation name → (Q, D_g) float32, one row per query."""


def parse_search(body: bytes, limits: Limits) -> SearchRequest:
    """The ``SearchRequest`` of a request body, or ``BadRequest``."""
    if len(body) > limits.max_body_bytes:
        raise BadRequest(413, f"request body of {len(body)} bytes, more than the {limits.max_body_bytes} allowed")
    try:
        document = json.loads(body)
    except RecursionError:
        raise BadRequest(400, "request body is nested too deeply") from None
    except ValueError as error:  # not JSON, not UTF-8/16/32, or an integer of more than 4300 digits
        raise BadRequest(400, f"request body is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise BadRequest(400, f"request body must be a JSON object, got {type(document).__name__}")
    unknown = sorted(set(document) - {*QUERY_FIELDS, "k", "generation"})
    if unknown:
        raise BadRequest(400, f"unknown field(s) {unknown}; expected one of {list(QUERY_FIELDS)}, 'k', 'generation'")
    given = [name for name in QUERY_FIELDS if name in document]
    if len(given) != 1:
        raise BadRequest(400, f"give exactly one of {list(QUERY_FIELDS)}, got {given or 'none'}")
    name = given[0]
    queries = document[name]
    if name == "embeddings" and isinstance(queries, dict):
        return _keyed_embeddings(queries, document, limits)
    if not isinstance(queries, list) or not queries:
        raise BadRequest(400, f"'{name}' must be a non-empty list, got {_describe(queries)}")
    if len(queries) > limits.max_queries:
        raise BadRequest(413, f"'{name}' holds {len(queries)} queries, more than the {limits.max_queries} allowed")
    k, generation = _k_and_generation(document, limits)
    if name == "embeddings":
        return SearchRequest(k, generation, embeddings=_embeddings(queries))
    if not all(isinstance(q, str) for q in queries):
        raise BadRequest(400, f"'{name}' must be a list of strings")
    if name == "images":
        return SearchRequest(k, generation, images=tuple(_base64(q, n) for n, q in enumerate(queries)))
    return SearchRequest(k, generation, uris=tuple(queries))


def _k_and_generation(document: dict, limits: Limits) -> tuple[int, str | None]:
    k = document.get("k", DEFAULT_K)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= limits.max_k:
        raise BadRequest(400, f"'k' must be an integer from 1 to {limits.max_k}, got {_QUOTE.repr(k)}")
    generation = document.get("generation")
    if generation is not None and (not isinstance(generation, str) or not 0 < len(generation) <= MAX_NAME):
        raise BadRequest(400, f"'generation' must be a generation name, got {_describe(generation)}")
    return k, generation


def _keyed_embeddings(keyed: dict, document: dict, limits: Limits) -> SearchRequest:
    """The request of an ``embeddings`` object (generation name → Q lists of numbers)."""
    if not keyed or len(keyed) > limits.max_queries:
        raise BadRequest(400, f"'embeddings' as an object must map 1 to {limits.max_queries} generation names to "
                              f"lists of embeddings, got {len(keyed)} entries")
    by_generation = {}
    for name, queries in keyed.items():
        if not 0 < len(name) <= MAX_NAME:
            raise BadRequest(400, f"'embeddings' keys must be generation names, got {_QUOTE.repr(name)}")
        if not isinstance(queries, list) or not queries:
            raise BadRequest(400, f"'embeddings'[{name!r}] must be a non-empty list, got {_describe(queries)}")
        if len(queries) > limits.max_queries:
            raise BadRequest(413, f"'embeddings'[{name!r}] holds {len(queries)} queries, more than the "
                                  f"{limits.max_queries} allowed")
        by_generation[name] = _embeddings(queries)
    rows = {name: len(array) for name, array in by_generation.items()}
    if len(set(rows.values())) != 1:
        raise BadRequest(400, f"'embeddings' must give every generation the same queries, got rows {rows}")
    k, generation = _k_and_generation(document, limits)
    return SearchRequest(k, generation, embeddings_by_generation=by_generation)


def keyed_queries(request: SearchRequest, serving: str, needed: Sequence[str], widths: Callable[[str], int]
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(the serving generation's (Q, D) queries, {generation: (Q, D_g)} for each of ``needed``) of
    an ``embeddings`` request, each width checked (``widths``: generation → its width; the rule is
    ``search.query_generations``'s, shared with ``orchestrator search``'s query files); BadRequest
    400 when one is missing, has the wrong width, or is not used by this search."""
    if request.embeddings is not None and needed:
        raise BadRequest(400, f"'embeddings' holds generation {serving!r}'s only, but its search interpolates with "
                              f"generation(s) {list(needed)}'s embeddings of the same queries (slerp): give "
                              f"'embeddings' as an object keyed by generation, {[serving, *needed]}")
    keyed = request.embeddings_by_generation if request.embeddings is None else {serving: request.embeddings}
    try:
        return split_by_generation(keyed or {}, serving, needed, widths, "'embeddings'")
    except ValueError as refused:
        raise BadRequest(400, str(refused)) from None


def allowed_uri(uri: str, prefixes: Sequence[str]) -> str:
    """``uri`` when it lies below one of ``prefixes`` and has no ``.`` or ``..`` component, query,
    fragment, backslash or NUL; else BadRequest (403) naming it."""
    below = any(uri.startswith(prefix.rstrip("/") + "/") for prefix in prefixes)
    components = uri.split("://", 1)[-1].split("/")
    if not below or any(c in uri for c in "\\?#\x00") or any(part in (".", "..") for part in components):
        configured = ", ".join(prefixes) if prefixes else "none configured: --read-prefix"
        raise BadRequest(403, f"uri {uri!r} is not under a prefix this server reads ({configured})")
    return uri


def decode_queries(request: SearchRequest, read_uri: Callable[[str], bytes],
                   decode: Callable[[bytes, str], np.ndarray], prefixes: Sequence[str]) -> np.ndarray:
    """(Q, H, W, 3) uint8 of an ``images`` or ``uris`` request: every image decoded by ``decode``
    (bytes, where → image, ValueError when undecodable → BadRequest); URIs checked against
    ``prefixes`` before ``read_uri`` reads them (a missing file → BadRequest 404)."""
    if request.images is not None:
        sources = [(data, f"'images'[{n}]") for n, data in enumerate(request.images)]
    else:
        sources = []
        for n, uri in enumerate(request.uris or ()):
            try:
                sources.append((read_uri(allowed_uri(uri, prefixes)), f"'uris'[{n}] {uri}"))
            except FileNotFoundError:
                raise BadRequest(404, f"'uris'[{n}]: no file at {uri!r}") from None
    images = []
    for data, where in sources:
        try:
            images.append(decode(data, where))
        except ValueError as error:
            raise BadRequest(400, str(error)) from None
    return np.stack(images)


def _embeddings(queries: list) -> np.ndarray:
    widths = {len(q) if isinstance(q, list) else -1 for q in queries}
    if -1 in widths or len(widths) != 1 or 0 in widths:
        raise BadRequest(400, f"'embeddings' must be a list of equally long non-empty lists of numbers, got widths "
                              f"{sorted(widths)}")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for q in queries for v in q):
        raise BadRequest(400, "'embeddings' must hold numbers only")
    out_of_range = BadRequest(400, "'embeddings' contain NaN, infinite or out-of-range values")
    try:
        with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, refused below
            array = np.asarray(queries, dtype=np.float32)
        finite = all(math.isfinite(v) for q in queries for v in q)
    except OverflowError:  # an integer beyond any float
        raise out_of_range from None
    if not finite or not np.isfinite(array).all():
        raise out_of_range
    return array


def _base64(text: str, number: int) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(400, f"'images'[{number}] is not base64") from None


def _describe(value: object) -> str:
    """The type and a short quote of a value a client sent (bounded however large or deep)."""
    return f"{type(value).__name__} {_QUOTE.repr(value)}"
