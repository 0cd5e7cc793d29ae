"""``POST /search`` bodies: what is accepted exactly as sent, and every refusal a 4xx with one line
naming the field and the value."""
import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from orchestrator.search.queries import decode_image
from orchestrator.serving.requests import (
    MAX_REASON,
    BadRequest,
    allowed_uri,
    decode_queries,
    keyed_queries,
    parse_search,
)
from orchestrator.serving.settings import Limits

LIMITS = Limits(max_body_bytes=4096, max_queries=3, max_k=50, max_pixels=64 * 64)


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def test_embeddings_are_read_as_float32_values_exactly_as_sent():
    values = np.random.default_rng(0).normal(size=(2, 5)).astype(np.float32)
    request = parse_search(body(embeddings=values.tolist(), k=7, generation="g1"), LIMITS)
    assert request.k == 7 and request.generation == "g1" and request.images is None
    np.testing.assert_array_equal(request.embeddings, values)
    assert parse_search(body(embeddings=[[1.0, 2.0]]), LIMITS).k == 10  # the default


@pytest.mark.parametrize("payload, status, words", [
    (b"x" * 5000, 413, "5000 bytes, more than the 4096"),
    (b"{not json", 400, "not JSON"),
    (b"[1, 2]", 400, "JSON object, got list"),
    (body(embeddings=[[1.0]], images=["AA=="]), 400, "exactly one of"),
    (body(k=3), 400, "exactly one of"),
    (body(embeddings=[[1.0]], color="red"), 400, "unknown field(s) ['color']"),
    (body(embeddings=[[1.0]] * 4), 413, "4 queries, more than the 3"),
    (body(embeddings=[]), 400, "non-empty list"),
    (body(embeddings=[[1.0]], k=0), 400, "'k' must be an integer from 1 to 50, got 0"),
    (body(embeddings=[[1.0]], k=51), 400, "got 51"),
    (body(embeddings=[[1.0]], k=True), 400, "got True"),
    (body(embeddings=[[1.0]], generation=""), 400, "'generation' must be a generation name"),
    (body(embeddings=[[1.0, 2.0], [1.0]]), 400, "widths [1, 2]"),
    (body(embeddings=[["a"]]), 400, "numbers only"),
    (b'{"embeddings": [[NaN]]}', 400, "NaN"),
    (b'{"embeddings": [[1e300]]}', 400, "out-of-range"),
    (body(images=["not base64!"]), 400, "'images'[0] is not base64"),
    (body(uris=[3]), 400, "list of strings"),
])
def test_bad_bodies_are_refused_with_a_one_line_reason(payload, status, words):
    with pytest.raises(BadRequest) as refused:
        parse_search(payload, LIMITS)
    assert refused.value.status == status and words in refused.value.reason and "\n" not in refused.value.reason


@pytest.mark.parametrize("payload, words", [
    (b'{"embeddings": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b'{"embeddings": [[1.0]], "k": ' + b"9" * 5000 + b"}", "not JSON: Exceeds the limit (4300 digits)"),
    (b'{"embeddings": [[' + b"9" * 4000 + b"]]}", "out-of-range"),
    (b'{"embeddings": [[1.0]], "k": 1e400}', "got inf"),
    (b'{"embeddings": [[1.0]], "k": ' + b"9" * 4000 + b"}", "got 999999999999999999...9999999999999999999"),
    (b'{"embeddings": [[1.0]]' + b"\xff}", "not JSON: 'utf-8' codec can't decode"),
    (json.dumps({"embeddings": [[1.0]], "generation": "g" * 257}).encode(), "must be a generation name, got str 'gggg"),
    (b'{"embeddings": {"a": {"b": ' + b"[" * 500 + b"]" * 500 + b"}}}",
     "'embeddings'['a'] must be a non-empty list, got dict {'b': [[...]]}"),
], ids=["nesting", "k of 5000 digits", "an embedding of 4000 digits", "k 1e400", "k of 4000 digits", "invalid UTF-8",
        "a long name", "a deep list quoted"])
def test_hostile_bodies_are_refused_with_a_short_one_line_reason(payload, words):
    with pytest.raises(BadRequest) as refused:
        parse_search(payload, Limits(max_body_bytes=1 << 20))
    reason = refused.value.reason
    assert refused.value.status == 400 and words in reason and "\n" not in reason and len(reason) <= MAX_REASON


def test_a_body_in_utf16_is_read_as_in_utf8():
    request = parse_search(json.dumps({"embeddings": [[1.0, 2.0]], "generation": "g1"}).encode("utf-16"), LIMITS)
    assert request.generation == "g1" and request.embeddings.tolist() == [[1.0, 2.0]]


def test_a_reason_is_one_printable_line_whatever_it_quotes():
    refused = BadRequest(400, "generation '\x1b[31mred\x1b[0m\nnext\ud800' is not in the lineage" + "!" * 400)
    assert refused.reason.startswith("generation 'red next\ufffd' is not in the lineage!!")
    assert len(refused.reason) == MAX_REASON and refused.reason.endswith("…")


def test_an_embedding_of_the_wrong_width_names_both_widths():
    narrow = parse_search(body(embeddings=[[1.0] * 3]), LIMITS)
    with pytest.raises(BadRequest, match="'embeddings' has 3 values per query for generation 'g1', which embeds 32") as refused:
        keyed_queries(narrow, "g1", (), {"g1": 32}.__getitem__)
    assert refused.value.status == 400
    wide = parse_search(body(embeddings=[[1.0] * 32] * 2), LIMITS)
    assert keyed_queries(wide, "g1", (), {"g1": 32}.__getitem__)[0].shape == (2, 32)


def test_images_decode_as_query_files_do_and_undecodable_or_huge_ones_are_refused(tmp_path):
    rgb = np.random.default_rng(1).integers(0, 256, (20, 20, 3), dtype=np.uint8)
    decode = lambda data, where: decode_image(data, 32, where, LIMITS.max_pixels)  # noqa: E731
    request = parse_search(body(images=[base64.b64encode(png(rgb)).decode()]), LIMITS)
    images = decode_queries(request, None, decode, ())
    expected = np.asarray(Image.fromarray(rgb).resize((32, 32), Image.Resampling.BILINEAR))
    assert images.shape == (1, 32, 32, 3)
    np.testing.assert_array_equal(images[0], expected)
    garbage = parse_search(body(images=[base64.b64encode(b"\x89PNG not really").decode()]), LIMITS)
    with pytest.raises(BadRequest, match=r"'images'\[0\]: not a decodable image") as refused:
        decode_queries(garbage, None, decode, ())
    assert refused.value.status == 400
    huge = parse_search(body(images=[base64.b64encode(png(np.zeros((65, 64, 3), np.uint8))).decode()]), Limits())
    with pytest.raises(BadRequest, match="image of 64x65 pixels, more than the 4096 allowed"):
        decode_queries(huge, None, decode, ())


def test_uris_are_read_only_below_the_configured_prefixes(tmp_path):
    allowed = str(tmp_path / "queries")
    (tmp_path / "queries").mkdir()
    (tmp_path / "queries" / "a.png").write_bytes(png(np.full((32, 32, 3), 7, np.uint8)))
    read = lambda uri: open(uri, "rb").read()  # noqa: E731
    decode = lambda data, where: decode_image(data, 32, where, LIMITS.max_pixels)  # noqa: E731
    request = parse_search(body(uris=[f"{allowed}/a.png"]), LIMITS)
    assert int(decode_queries(request, read, decode, (allowed,))[0, 0, 0, 0]) == 7
    for uri in (f"{allowed}/../secret.png", f"{allowed}x/a.png", "/etc/passwd", f"{allowed}/./a.png", f"{allowed}/a.png?x"):
        with pytest.raises(BadRequest, match="is not under a prefix this server reads") as refused:
            allowed_uri(uri, (allowed,))
        assert refused.value.status == 403
    with pytest.raises(BadRequest, match="none configured"):
        allowed_uri(f"{allowed}/a.png", ())
    missing = parse_search(body(uris=[f"{allowed}/b.png"]), LIMITS)
    with pytest.raises(BadRequest, match=r"'uris'\[0\]: no file at") as refused:
        decode_queries(missing, read, decode, (allowed,))
    assert refused.value.status == 404


def test_embeddings_keyed_by_generation_give_a_slerp_search_both_generations_queries():
    new, old = np.ones((2, 4), np.float32), np.full((2, 3), 0.5, np.float32)
    request = parse_search(body(embeddings={"g1": new.tolist(), "g0": old.tolist()}, k=4), LIMITS)
    assert request.embeddings is None and request.k == 4
    widths = {"g1": 4, "g0": 3}.__getitem__
    queries, others = keyed_queries(request, "g1", ("g0",), widths)
    np.testing.assert_array_equal(queries, new)
    assert list(others) == ["g0"] and np.array_equal(others["g0"], old)
    # a search without an interpolating path takes the plain list, and the list form of a slerp search is refused
    plain = parse_search(body(embeddings=new.tolist()), LIMITS)
    assert keyed_queries(plain, "g1", (), widths)[1] == {}
    with pytest.raises(BadRequest, match=r"holds generation 'g1''s only, but its search interpolates with "
                                         r"generation\(s\) \['g0'\]'s embeddings"):
        keyed_queries(plain, "g1", ("g0",), widths)


@pytest.mark.parametrize("embeddings, words", [
    ({"g1": [[1.0] * 4]}, "no entry for generation(s) ['g0']; this search takes ['g1', 'g0']"),
    ({"g1": [[1.0] * 4], "g0": [[1.0] * 2]}, "'embeddings' has 2 values per query for generation 'g0', which embeds 3"),
    ({"g1": [[1.0] * 4], "g0": [[1.0] * 3], "g7": [[1.0]]}, "entries for generation(s) ['g7'] this search does not use"),
])
def test_a_missing_or_wrong_old_generation_embedding_is_a_one_line_400(embeddings, words):
    request = parse_search(body(embeddings=embeddings), LIMITS)
    with pytest.raises(BadRequest) as refused:
        keyed_queries(request, "g1", ("g0",), {"g1": 4, "g0": 3, "g7": 1}.__getitem__)
    assert refused.value.status == 400 and words in refused.value.reason and "\n" not in refused.value.reason


@pytest.mark.parametrize("payload, status, words", [
    (body(embeddings={}), 400, "must map 1 to 3 generation names"),
    (body(embeddings={"g1": [[1.0]], "g0": [[1.0], [2.0]]}), 400, "the same queries, got rows {'g1': 1, 'g0': 2}"),
    (body(embeddings={"g1": [[1.0]] * 4}), 413, "'embeddings'['g1'] holds 4 queries"),
    (body(embeddings={"g1": [[float("nan")]]}), 400, "NaN"),
])
def test_bad_keyed_embeddings_are_refused(payload, status, words):
    with pytest.raises(BadRequest) as refused:
        parse_search(payload, LIMITS)
    assert refused.value.status == status and words in refused.value.reason
