"""ShardIndex: exact search equals brute force per space; IVF/HNSW recall; serialisation; errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrator.geometry import Geometry, lorentz
from orchestrator.geometry.spaces import Space
from orchestrator.index import MAGIC, ShardIndex, build_index, default_nlist

# (space, curv, data dimension d)
SPACES = [
    ("euclidean", 1.0, 16),
    ("cosine", 1.0, 16),
    ("lorentz", 1.0, 16),
    ("lorentz", 0.5, 16),
    ("poincare", 0.1, 16),
]


def _points(space: str, curv: float, n: int, d: int, seed: int) -> np.ndarray:
    """Random float32 points of ``space`` (lorentz: (n, d+1) on the hyperboloid, time first)."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(n, d, generator=gen, dtype=torch.float64)
    if space == "lorentz":
        x = lorentz.expmap0(0.4 * v, curv)
    elif space == "poincare":
        x = lorentz.to_poincare(lorentz.expmap0(0.4 * v, curv), curv)
    else:
        x = v
    return x.to(torch.float32).numpy()


def _reference(space: str, curv: float, queries: np.ndarray, gallery: np.ndarray) -> np.ndarray:
    """Brute-force float64 distances (Q, N) with the geometry layer."""
    q = torch.from_numpy(queries).to(torch.float64)
    g = torch.from_numpy(gallery).to(torch.float64)
    return Geometry(space, curv).pairwise_distance(q, g).numpy()


@pytest.mark.parametrize("space,curv,d", SPACES)
def test_flat_matches_brute_force(space, curv, d):
    gallery = _points(space, curv, 500, d, seed=1)
    queries = _points(space, curv, 40, d, seed=2)
    ids = np.arange(500, dtype=np.int64) * 7 + 1000  # non-trivial id mapping
    index = build_index(gallery, space, ids=ids, curv=curv)
    assert index.ntotal == 500 and index.dim == gallery.shape[1] and index.space is Space(space)
    k = 10
    distances, found = index.search(queries, k)
    assert distances.shape == (40, k) and found.shape == (40, k) and found.dtype == np.int64

    ref = _reference(space, curv, queries, gallery)
    order = np.argsort(ref, axis=1, kind="stable")[:, :k]
    ref_top = np.take_along_axis(ref, order, axis=1)
    # distances equal the reference top-k distances
    np.testing.assert_allclose(distances, ref_top, rtol=1e-4, atol=1e-6)
    # each returned id's reference distance is the returned distance (id mapping is right)
    rows = (found - 1000) // 7
    assert ((found - 1000) % 7 == 0).all()
    np.testing.assert_allclose(np.take_along_axis(ref, rows, axis=1), distances, rtol=1e-4, atol=1e-6)
    # ids equal where the reference distance is not (nearly) tied with a neighbour in the ranking
    full = np.sort(ref, axis=1)[:, : k + 1]
    gaps = np.diff(full, axis=1)
    untied = np.ones((40, k), dtype=bool)
    untied &= gaps[:, :k] > 1e-4 * np.abs(full[:, 1:])
    untied[:, 1:] &= gaps[:, : k - 1] > 1e-4 * np.abs(full[:, 1:k])
    assert untied.mean() > 0.9
    np.testing.assert_array_equal(found[untied], ids[order][untied])


def test_lorentz_inner_product_trick_sign():
    """Largest <q,x>_L is the nearest point: the FAISS score ranking and the geodesic one agree."""
    gallery = _points("lorentz", 1.0, 200, 8, seed=3)
    query = _points("lorentz", 1.0, 1, 8, seed=4)
    index = build_index(gallery, "lorentz")
    _, found = index.search(query, 1)
    inner = lorentz.pairwise_inner(torch.from_numpy(query).double(), torch.from_numpy(gallery).double())
    assert found[0, 0] == int(inner.argmax())


def test_default_ids_and_missing_results():
    gallery = _points("euclidean", 1.0, 5, 4, seed=5)
    index = build_index(gallery, "euclidean")
    distances, found = index.search(gallery, 8)
    assert (found[:, 0] == np.arange(5)).all()
    np.testing.assert_allclose(distances[:, 0], 0.0, atol=1e-6)
    assert (found[:, 5:] == -1).all() and np.isinf(distances[:, 5:]).all()
    assert (found[:, :5] >= 0).all() and np.isfinite(distances[:, :5]).all()


def test_cosine_zero_vector_has_distance_one():
    gallery = np.array([[1.0, 0.0], [0.0, 0.0]], dtype=np.float32)
    distances, found = build_index(gallery, "cosine").search(np.array([[2.0, 0.0]]), 2)
    np.testing.assert_allclose(distances[0], [0.0, 1.0], atol=1e-7)
    assert found[0].tolist() == [0, 1]


@pytest.fixture(scope="module")
def recall_data():
    gen = np.random.default_rng(0)
    gallery = gen.standard_normal((5000, 32)).astype(np.float32)
    queries = gen.standard_normal((100, 32)).astype(np.float32)
    _, exact = build_index(gallery, "euclidean").search(queries, 10)
    return gallery, queries, exact


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_recall(recall_data, kind):
    gallery, queries, exact = recall_data
    # random Gaussian data is IVF's worst case: probe half the cells (default is a quarter)
    index = build_index(gallery, "euclidean", kind=kind, nprobe=64 if kind == "ivf" else None)
    distances, found = index.search(queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact)])
    assert recall > 0.9, recall
    assert (np.diff(distances, axis=1) >= 0).all()


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_recall_lorentz(kind):
    gallery = _points("lorentz", 0.5, 3000, 16, seed=6)
    queries = _points("lorentz", 0.5, 50, 16, seed=7)
    exact_d, exact = build_index(gallery, "lorentz", curv=0.5).search(queries, 10)
    index = build_index(gallery, "lorentz", kind=kind, curv=0.5, nprobe=24 if kind == "ivf" else None)
    distances, found = index.search(queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact)])
    assert recall > 0.9, recall
    # returned distances are exact geodesic distances of the returned ids
    ref = _reference("lorentz", 0.5, queries, gallery)
    np.testing.assert_allclose(distances, np.take_along_axis(ref, found, axis=1), rtol=1e-4)


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
@pytest.mark.parametrize("space,curv", [("euclidean", 1.0), ("cosine", 1.0), ("lorentz", 0.5), ("poincare", 0.1)])
def test_serialize_round_trip(space, curv, kind):
    gallery = _points(space, curv, 400, 8, seed=8)
    queries = _points(space, curv, 20, 8, seed=9)
    index = build_index(gallery, space, kind=kind, ids=np.arange(400) + 50, curv=curv, nlist=8 if kind == "ivf" else None)
    data = index.to_bytes()
    assert data.startswith(MAGIC)
    restored = ShardIndex.from_bytes(data)
    assert (restored.space, restored.curv, restored.kind, restored.dim, restored.ntotal) == (
        index.space, index.curv, index.kind, index.dim, index.ntotal
    )
    assert (restored.nprobe, restored.ef_search) == (index.nprobe, index.ef_search)
    for a, b in zip(index.search(queries, 7), restored.search(queries, 7)):
        np.testing.assert_array_equal(a, b)


def test_save_load_local(tmp_path):
    gallery = _points("poincare", 0.1, 300, 8, seed=10)
    index = build_index(gallery, "poincare", kind="hnsw", curv=0.1, ef_search=77)
    uri = str(tmp_path / "shards" / "shard-0.faiss")
    index.save(uri)
    loaded = ShardIndex.load(uri)
    assert loaded.ef_search == 77 and loaded.kind == "hnsw" and loaded.curv == 0.1
    for a, b in zip(index.search(gallery[:5], 4), loaded.search(gallery[:5], 4)):
        np.testing.assert_array_equal(a, b)
    # file:// URIs go through the same storage layer
    assert ShardIndex.load("file://" + uri).ntotal == 300
    with pytest.raises(FileNotFoundError):
        ShardIndex.load(str(tmp_path / "missing.faiss"))


def test_corrupt_bytes_are_rejected(tmp_path):
    data = build_index(_points("euclidean", 1.0, 50, 4, seed=11), "euclidean").to_bytes()
    with pytest.raises(ValueError, match="magic"):
        ShardIndex.from_bytes(b"not an index at all")
    with pytest.raises(ValueError, match="checksum"):
        ShardIndex.from_bytes(data[:-10])
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF
    with pytest.raises(ValueError, match="checksum"):
        ShardIndex.from_bytes(bytes(flipped))
    (tmp_path / "bad.faiss").write_bytes(data[:12])
    with pytest.raises(ValueError, match="bad.faiss"):
        ShardIndex.load(str(tmp_path / "bad.faiss"))


def test_bytes_checked_whole_against_the_lineage_are_not_hashed_again():
    import hashlib

    from orchestrator.integrity import IntegrityError, index_of_checked_bytes

    gallery = _points("euclidean", 1.0, 50, 4, seed=11)
    data = build_index(gallery, "euclidean").to_bytes()
    # the same index with a wrong payload checksum in its header: only the header's own check catches it
    header_end = data.index(b'"faiss_sha256": "') + len('"faiss_sha256": "')
    relabelled = data[:header_end] + b"0" * 64 + data[header_end + 64:]
    with pytest.raises(ValueError, match="checksum"):
        ShardIndex.from_bytes(relabelled)
    assert ShardIndex.from_bytes(relabelled, whole_file_checked=True).ntotal == 50
    record = {"sha256": hashlib.sha256(data).hexdigest(), "n_items": 50}
    found = index_of_checked_bytes(data, "s.faiss", record, 50).search(gallery[:3], 1)[1]
    assert found[:, 0].tolist() == [0, 1, 2]
    with pytest.raises(IntegrityError, match="s.faiss: index file changed"):
        index_of_checked_bytes(relabelled, "s.faiss", record, 50)  # the whole file's hash is checked first


def test_set_search_params():
    gallery = _points("euclidean", 1.0, 2000, 8, seed=12)
    index = build_index(gallery, "euclidean", kind="ivf", nlist=16)
    assert index.nprobe == 4
    index.set_search_params(nprobe=16)
    _, found = index.search(gallery[:10], 1)
    assert (found[:, 0] == np.arange(10)).all()  # probing every cell is exact
    with pytest.raises(ValueError, match="ef_search"):
        index.set_search_params(ef_search=10)


def test_errors():
    gallery = _points("euclidean", 1.0, 100, 4, seed=13)
    with pytest.raises(ValueError, match="space"):
        build_index(gallery, "spherical")
    with pytest.raises(ValueError, match="kind"):
        build_index(gallery, "euclidean", kind="lsh")
    with pytest.raises(ValueError, match="embeddings"):
        build_index(gallery[0], "euclidean")
    bad = gallery.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="embeddings.*non-finite"):
        build_index(bad, "euclidean")
    with pytest.raises(ValueError, match="ids"):
        build_index(gallery, "euclidean", ids=np.arange(99))
    with pytest.raises(ValueError, match="ids.*unique"):
        build_index(gallery, "euclidean", ids=np.zeros(100, dtype=np.int64))
    with pytest.raises(ValueError, match="ids"):
        build_index(gallery, "euclidean", ids=np.arange(100) - 1)
    with pytest.raises(ValueError, match="curv"):
        build_index(gallery, "lorentz", curv=0.0)
    with pytest.raises(ValueError, match="lorentz"):
        build_index(gallery[:, :1], "lorentz")
    with pytest.raises(ValueError, match="poincare.*ball"):
        build_index(gallery * 10, "poincare", curv=1.0)
    with pytest.raises(ValueError, match="nlist"):
        build_index(gallery, "euclidean", kind="ivf", nlist=200)
    with pytest.raises(ValueError, match="nprobe"):
        build_index(gallery, "euclidean", kind="flat", nprobe=4)
    with pytest.raises(ValueError, match="nprobe"):
        build_index(gallery, "euclidean", kind="ivf", nlist=2, nprobe=0)
    index = build_index(gallery, "euclidean")
    with pytest.raises(ValueError, match="queries must have dimension 4"):
        index.search(np.zeros((2, 5), dtype=np.float32), 3)
    with pytest.raises(ValueError, match="queries.*non-finite"):
        index.search(np.full((1, 4), np.inf), 3)
    with pytest.raises(ValueError, match="k must be"):
        index.search(gallery[:2], 0)
    assert default_nlist(5000) == 128 and default_nlist(10) == 1
