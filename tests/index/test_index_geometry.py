"""What the indexes store and return, checked against each space's formulas written out in numpy here.

The stored vectors must be exactly the float32 rounding of the coordinates computed independently
below, the serialised bytes must be the documented header + FAISS bytes, and the returned
distances must equal the geodesic / L2 / cosine distances to within 1e-12.
"""

from __future__ import annotations

import hashlib
import json
import struct

import faiss
import numpy as np
import pytest

from orchestrator.index import MAGIC, build_index
from orchestrator.index.container import pack_header, unpack_header

TOL = 1e-12
SPACES = [("euclidean", 1.0), ("cosine", 1.0), ("lorentz", 1.0), ("lorentz", 0.5), ("poincare", 0.1), ("poincare", 1.0)]


def _points(space: str, curv: float, n: int, d: int, seed: int) -> np.ndarray:
    """float32 points of ``space`` built in numpy (lorentz: expmap0 onto the hyperboloid, time first)."""
    v = 0.6 * np.random.default_rng(seed).standard_normal((n, d))
    if space in ("euclidean", "cosine"):
        return v.astype(np.float32)
    norm = np.linalg.norm(v, axis=1, keepdims=True)
    xs = np.sinh(np.sqrt(curv) * norm) * v / (np.sqrt(curv) * norm)
    xt = np.sqrt(1.0 / curv + (xs**2).sum(1, keepdims=True))
    if space == "poincare":
        return (xs / (1.0 + np.sqrt(curv) * xt)).astype(np.float32)
    return np.concatenate([xt, xs], axis=1).astype(np.float32)


def _hyperboloid(x: np.ndarray, space: str, curv: float) -> np.ndarray:
    """Full Lorentz points [x_t, x_s] of lorentz (time recomputed) or poincare (x_s = 2p/(1-c||p||^2)) rows."""
    x = x.astype(np.float64)
    xs = x[:, 1:] if space == "lorentz" else 2.0 * x / (1.0 - curv * (x**2).sum(1, keepdims=True))
    return np.concatenate([np.sqrt(1.0 / curv + (xs**2).sum(1, keepdims=True)), xs], axis=1)


def _expected_stored(x: np.ndarray, space: str, curv: float, kind: str) -> np.ndarray:
    """The rows a ShardIndex stores (module docstring of ``shard_index``), float32."""
    x64 = x.astype(np.float64)
    if space == "euclidean":
        return x
    if space == "cosine":
        return (x64 / np.linalg.norm(x64, axis=1, keepdims=True)).astype(np.float32)
    points = _hyperboloid(x, space, curv)
    if kind != "flat":  # MIPS-to-L2 column: every stored row has the norm M
        squared = (points**2).sum(1, keepdims=True)
        points = np.concatenate([points, np.sqrt(np.maximum(squared.max() * (1 + 1e-6) - squared, 0.0))], axis=1)
    return points.astype(np.float32)


def _lorentz_chord_distance(q: np.ndarray, x: np.ndarray, curv: float) -> np.ndarray:
    """(2/sqrt c) asinh(sqrt(c) sqrt(<q-x,q-x>_L) / 2) row-wise: equals arccosh(-c<q,x>_L)/sqrt(c) on the hyperboloid."""
    diff = q - x
    chord = (diff[..., 1:] ** 2).sum(-1) - diff[..., 0] ** 2
    return 2.0 / np.sqrt(curv) * np.arcsinh(np.sqrt(curv) * np.sqrt(chord) / 2.0)


def _expected_distances(queries: np.ndarray, stored: np.ndarray, space: str, curv: float, kind: str) -> np.ndarray:
    """Distances of each query (Q, D) to its hits' stored rows (Q, k, D'), float64."""
    q64, s64 = queries.astype(np.float64), stored.astype(np.float64)
    if space == "euclidean":
        return np.sqrt(((q64[:, None] - s64) ** 2).sum(-1))
    if space == "cosine":
        return 1.0 - ((q64 / np.linalg.norm(q64, axis=1, keepdims=True))[:, None] * s64).sum(-1)
    q = _hyperboloid(queries, space, curv)[:, None]
    if kind == "flat":  # stored rows as stored (float32-rounded, so slightly off the hyperboloid)
        return _lorentz_chord_distance(q, s64, curv)
    x = _hyperboloid(s64[..., :-1].reshape(-1, s64.shape[-1] - 1), "lorentz", curv).reshape(s64.shape[:-1] + (-1,))
    inner = (q[..., 1:] * x[..., 1:]).sum(-1) - q[..., 0] * x[..., 0]
    return np.arccosh(-curv * inner) / np.sqrt(curv)  # HBCT eq. 3, directly


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
@pytest.mark.parametrize("space,curv", SPACES)
def test_shard_index_stores_the_coordinates_and_returns_the_space_distance(space, curv, kind):
    gallery, queries = _points(space, curv, 600, 8, seed=1), _points(space, curv, 25, 8, seed=2)
    ids = np.arange(600, dtype=np.int64) * 3 + 5
    index = build_index(gallery, space, kind, ids, curv=curv, **({"nlist": 8} if kind == "ivf" else {}))
    expected = _expected_stored(gallery, space, curv, kind)
    np.testing.assert_array_equal(index.index.reconstruct_batch(ids), expected)  # bit-identical rows

    distances, found = index.search(queries, 5)
    assert (found >= 0).all()
    hits = expected[(found - 5) // 3]
    np.testing.assert_allclose(distances, _expected_distances(queries, hits, space, curv, kind), rtol=0, atol=TOL)


@pytest.mark.parametrize("space,curv", [("lorentz", 0.5), ("poincare", 0.1)])
def test_shard_index_bytes_are_the_header_then_the_faiss_bytes(space, curv):
    index = build_index(_points(space, curv, 200, 6, seed=3), space, "hnsw", curv=curv)
    data = index.to_bytes()
    payload = faiss.serialize_index(index.index).tobytes()
    header = dict(index.header(), faiss_sha256=hashlib.sha256(payload).hexdigest())
    raw = json.dumps(header, sort_keys=True, allow_nan=False).encode("utf-8")
    assert data == MAGIC + struct.pack("<I", len(raw)) + raw + payload
    assert header["space"] == space and header["curv"] == curv


@pytest.mark.parametrize("space,curv", [("lorentz", 0.5), ("poincare", 0.1), ("cosine", 1.0)])
def test_float_rerank_stores_ball_coordinates_and_returns_the_geodesic_distance(space, curv):
    gallery, queries = _points(space, curv, 300, 8, seed=4), _points(space, curv, 10, 8, seed=5)
    index = build_index(gallery, space, "binary_two_stage", curv=curv, rerank="float", rerank_factor=300)

    def ball(x: np.ndarray) -> np.ndarray:  # binary_hyperbolic.md eq. 12 / normalisation, numpy
        x = x.astype(np.float64)
        if space == "cosine":
            return x / np.linalg.norm(x, axis=1, keepdims=True)
        points = _hyperboloid(x, space, curv)
        return points[:, 1:] / (1.0 + np.sqrt(curv) * points[:, :1])

    np.testing.assert_array_equal(index.vectors, ball(gallery).astype(np.float32))
    distances, found = index.search(queries, 4)
    p, r = ball(queries)[:, None], index.vectors[found].astype(np.float64)
    if space == "cosine":
        expected = 1.0 - (p * r).sum(-1)
    else:
        denominator = (1.0 - curv * (p**2).sum(-1)) * (1.0 - curv * (r**2).sum(-1))
        expected = np.arccosh(1.0 + 2.0 * curv * ((p - r) ** 2).sum(-1) / denominator) / np.sqrt(curv)
    np.testing.assert_allclose(distances, expected, rtol=0, atol=TOL)


def test_pack_header_round_trip_and_errors_name_the_format():
    data = pack_header(b"TESTMAG1", {"format_version": 3, "b": [1, 2], "a": "x"}) + b"payload"
    assert data[12:] == b'{"a": "x", "b": [1, 2], "format_version": 3}payload'
    header, offset = unpack_header(data, b"TESTMAG1", "test index", 3)
    assert header == {"a": "x", "b": [1, 2], "format_version": 3} and data[offset:] == b"payload"
    with pytest.raises(ValueError, match="not a serialised test index \\(bad magic bytes\\)"):
        unpack_header(data, b"OTHERMAG", "test index", 3)
    with pytest.raises(ValueError, match="truncated: the test index header"):
        unpack_header(data[:20], b"TESTMAG1", "test index", 3)
    with pytest.raises(ValueError, match="unsupported test index format"):
        unpack_header(data, b"TESTMAG1", "test index", 2)
    with pytest.raises(ValueError, match="invalid test index header"):
        unpack_header(b"TESTMAG1" + struct.pack("<I", 3) + b"{x}", b"TESTMAG1", "test index", 3)
