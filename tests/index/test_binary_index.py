"""BinaryIndex: each kind's distances and ranking against brute force computed here with plain numpy,
memory, Lorentz input, ranking quality on clustered Poincaré data, and option errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrator.geometry import lorentz, poincare
from orchestrator.index import BinaryIndex, build_index

CURV = 0.1


def _poincare_points(n: int, d: int, seed: int, scale: float = 0.5) -> np.ndarray:
    """Random float32 points of the Poincaré ball of curvature ``CURV``."""
    gen = torch.Generator().manual_seed(seed)
    v = scale * torch.randn(n, d, generator=gen, dtype=torch.float64)
    return poincare.expmap0(v, CURV).to(torch.float32).numpy()


def _brute_force(queries: np.ndarray, gallery: np.ndarray, bits: int, weighted: bool) -> tuple[np.ndarray, float]:
    """``(Q, N)`` Hamming distances (weighted: d_H^Σ, eq. 10) and s², from integer codes computed here:
    global min/max range of the gallery, round half up, clip, MSB-first planes."""
    lo, hi = gallery.astype(np.float64).min(), gallery.astype(np.float64).max()
    step = (hi - lo) / (2**bits - 1)

    def ints(x):
        return np.clip(np.floor((x.astype(np.float64) - lo) / step + 0.5), 0, 2**bits - 1).astype(np.int64)

    qi, gi = ints(queries), ints(gallery)
    total = np.zeros((len(queries), len(gallery)), dtype=np.int64)
    for i in range(bits):  # plane i (0 = MSB) has weight 4^(n-1-i)
        qb, gb = (qi >> (bits - 1 - i)) & 1, (gi >> (bits - 1 - i)) & 1
        differ = (qb[:, None, :] != gb[None, :, :]).sum(axis=-1)
        total += (4 ** (bits - 1 - i) if weighted else 1) * differ
    return total, step**2


def _check_against(distances, found, reference, k):
    """Returned distances are the reference top-k; each returned id has the distance it is returned with."""
    np.testing.assert_allclose(distances, np.sort(reference, axis=1)[:, :k], rtol=1e-12)
    np.testing.assert_allclose(np.take_along_axis(reference, found, axis=1), distances, rtol=1e-12)
    assert len(np.unique(found, axis=None)) > 1 and (np.diff(distances, axis=1) >= 0).all()


@pytest.mark.parametrize("bits, d", [(1, 16), (2, 16), (2, 13), (3, 24)])
def test_weighted_equals_brute_force_weighted_hamming(bits, d):
    gallery, queries = _poincare_points(600, d, seed=1), _poincare_points(30, d, seed=2)
    index = build_index(gallery, "poincare", "binary_weighted", curv=CURV, bits=bits)
    distances, found = index.search(queries, 20)
    hamming, s2 = _brute_force(queries, gallery, bits, weighted=True)
    _check_against(distances, found, s2 * hamming, 20)


@pytest.mark.parametrize("bits", [1, 2, 3])
def test_plain_equals_brute_force_hamming(bits):
    gallery, queries = _poincare_points(600, 16, seed=3), _poincare_points(30, 16, seed=4)
    index = build_index(gallery, "poincare", "binary", curv=CURV, bits=bits)
    distances, found = index.search(queries, 20)
    hamming, s2 = _brute_force(queries, gallery, bits, weighted=False)
    _check_against(distances, found, s2 * hamming, 20)
    if bits == 1:  # one plane: plain and weighted Hamming are the same distance
        np.testing.assert_array_equal(hamming, _brute_force(queries, gallery, 1, weighted=True)[0])


def test_two_stage_reranks_by_weighted_hamming():
    gallery, queries = _poincare_points(800, 16, seed=5), _poincare_points(40, 16, seed=6)
    ids = np.arange(800) * 3 + 11
    weighted = build_index(gallery, "poincare", "binary_weighted", ids=ids, curv=CURV)
    exact_d, _ = weighted.search(queries, 10)
    # enough candidates (10 · 80 = every item): exactly the weighted mode's distances
    full = build_index(gallery, "poincare", "binary_two_stage", ids=ids, curv=CURV, rerank_factor=80)
    distances, found = full.search(queries, 10)
    np.testing.assert_array_equal(distances, exact_d)
    hamming, s2 = _brute_force(queries, gallery, 2, weighted=True)
    np.testing.assert_allclose(np.take_along_axis(s2 * hamming, (found - 11) // 3, axis=1), distances, rtol=1e-12)
    # fewer candidates: never better than the exact top-k, and the same units
    few = build_index(gallery, "poincare", "binary_two_stage", ids=ids, curv=CURV, rerank_factor=2)
    few_d, _ = few.search(queries, 10)
    assert (few_d >= exact_d - 1e-12).all() and np.mean(few_d == exact_d) > 0.5
    assert few.code_bytes == 4 and weighted.code_bytes == 10  # re-ranking reads the plain codes only


def test_float_rerank_is_the_poincare_ranking_of_the_candidates():
    gallery, queries = _poincare_points(800, 16, seed=7), _poincare_points(40, 16, seed=8)
    k, factor = 10, 5
    index = build_index(gallery, "poincare", "binary_two_stage", curv=CURV, rerank="float", rerank_factor=factor)
    distances, found = index.search(queries, k)
    # the candidate set: the plain-Hamming top (k·factor) of the same codes
    _, candidates = build_index(gallery, "poincare", "binary", curv=CURV).search(queries, k * factor)
    exact = poincare.pairwise_distance(torch.from_numpy(queries).double(), torch.from_numpy(gallery).double(), CURV).numpy()
    candidate_d = np.take_along_axis(exact, candidates, axis=1)
    np.testing.assert_allclose(distances, np.sort(candidate_d, axis=1)[:, :k], rtol=1e-5)
    np.testing.assert_allclose(np.take_along_axis(exact, found, axis=1), distances, rtol=1e-5)
    assert all(set(row) <= set(cand) for row, cand in zip(found, candidates))
    # every item a candidate: the exact Poincaré search of ShardIndex
    everything = build_index(gallery, "poincare", "binary_two_stage", curv=CURV, rerank="float", rerank_factor=80)
    flat_d, _ = build_index(gallery, "poincare", "flat", curv=CURV).search(queries, k)
    np.testing.assert_allclose(everything.search(queries, k)[0], flat_d, rtol=1e-5)
    assert index.memory_bytes == 800 * (4 + 16 * 4)  # plain codes + float32 coordinates


@pytest.mark.parametrize("codes, flat_kind", [("weighted", "binary_weighted"), ("plain", "binary")])
def test_ivf_probing_every_cell_equals_flat(codes, flat_kind):
    gallery, queries = _poincare_points(2000, 16, seed=9), _poincare_points(30, 16, seed=10)
    ids = np.arange(2000) + 100
    flat_d, _ = build_index(gallery, "poincare", flat_kind, ids=ids, curv=CURV).search(queries, 15)
    ivf = build_index(gallery, "poincare", "binary_ivf", ids=ids, curv=CURV, nlist=16, codes=codes)
    assert ivf.nprobe == 4
    partial_d, _ = ivf.search(queries, 15)
    assert (partial_d >= flat_d - 1e-12).all()  # probing a quarter of the cells can only miss items
    ivf.set_search_params(nprobe=16)
    distances, found = ivf.search(queries, 15)
    np.testing.assert_array_equal(distances, flat_d)
    hamming, s2 = _brute_force(queries, gallery, 2, weighted=codes == "weighted")
    np.testing.assert_allclose(np.take_along_axis(s2 * hamming, found - 100, axis=1), distances, rtol=1e-12)


@pytest.mark.parametrize("bits", [2, 3])
def test_memory_per_item(bits):
    gallery = _poincare_points(1000, 128, seed=11)
    plain = build_index(gallery, "poincare", "binary", curv=CURV, bits=bits)
    weighted = build_index(gallery, "poincare", "binary_weighted", curv=CURV, bits=bits)
    assert plain.code_bytes == 128 * bits / 8 and weighted.code_bytes == 128 * (4**bits - 1) / 24
    assert plain.memory_bytes == 1000 * plain.code_bytes  # default ids: nothing else stored
    with_ids = build_index(gallery, "poincare", "binary", ids=np.arange(1000) + 1, curv=CURV, bits=bits)
    assert with_ids.memory_bytes == 1000 * (plain.code_bytes + 8)
    assert 4 * 128 / plain.code_bytes == 32 / bits  # float32 bytes / code bytes: 16× at 2 bits


def test_lorentz_input_equals_its_poincare_image():
    gen = torch.Generator().manual_seed(12)
    points = lorentz.expmap0(0.5 * torch.randn(700, 16, generator=gen, dtype=torch.float64), CURV)
    queries = lorentz.expmap0(0.5 * torch.randn(25, 16, generator=gen, dtype=torch.float64), CURV)
    # the isometry of spec eq. 12 at curvature K, written out here: p = x_s / (1 + sqrt(K) x_t)
    image = (points[:, 1:] / (1.0 + CURV**0.5 * points[:, :1])).numpy()
    query_image = (queries[:, 1:] / (1.0 + CURV**0.5 * queries[:, :1])).numpy()
    for kind, options in [("binary", {}), ("binary_weighted", {}), ("binary_two_stage", {"rerank": "float"})]:
        from_lorentz = build_index(points.numpy(), "lorentz", kind, curv=CURV, **options)
        from_ball = build_index(image, "poincare", kind, curv=CURV, **options)
        assert from_lorentz.dim == 17 and from_ball.dim == 16
        a_d, a_i = from_lorentz.search(queries.numpy(), 10)
        b_d, b_i = from_ball.search(query_image, 10)
        np.testing.assert_allclose(a_d, b_d, rtol=1e-6)
        assert np.mean(a_i == b_i) > 0.95  # ids may swap inside exact ties only
    # float re-rank distances of Lorentz input are geodesic distances on the hyperboloid
    exact = lorentz.pairwise_distance(queries, points, CURV).numpy()
    _, found = from_lorentz.search(queries.numpy(), 10)
    np.testing.assert_allclose(np.take_along_axis(exact, found, axis=1), from_lorentz.search(queries.numpy(), 10)[0],
                               rtol=1e-5)


def _average_precision_at_k(found_labels: np.ndarray, query_labels: np.ndarray) -> float:
    """mAP@k with the hashing convention: AP = mean of precision@j over the relevant ranks j <= k."""
    relevant = found_labels == query_labels[:, None]
    precision = np.cumsum(relevant, axis=1) / np.arange(1, relevant.shape[1] + 1)
    hits = relevant.sum(axis=1)
    return float(np.mean(np.where(hits > 0, (precision * relevant).sum(axis=1) / np.maximum(hits, 1), 0.0)))


def test_binary_search_recovers_the_classes_of_float_search():
    """Ten classes in the ball of curvature 0.1: centres at tangent norm 2.2 (about 3.1 apart), items at
    tangent distance ~1 around them, then exp_0. Exact Poincaré search is perfect (asserted), so the
    classes are separable; 2-bit codes blur items near the class boundaries and may lose at most
    0.01 mAP@20, the issue's quality target (measured: 0.9956 plain, 0.9984 weighted and two-stage;
    with the spread at 2, float 0.993 and binary 0.88-0.90, so the check does see lost neighbours)."""
    rng = np.random.default_rng(13)
    d, per_class, k = 32, 60, 20
    centres = rng.standard_normal((10, d))
    centres *= 2.2 / np.linalg.norm(centres, axis=1, keepdims=True)
    labels = np.repeat(np.arange(10), per_class)
    tangent = centres[labels] + 1.0 / np.sqrt(d) * rng.standard_normal((len(labels), d))
    points = poincare.expmap0(torch.from_numpy(tangent), CURV).numpy()
    queries = rng.choice(len(points), size=100, replace=False)

    def mean_ap(kind: str) -> float:
        _, found = build_index(points, "poincare", kind, curv=CURV).search(points[queries], k + 1)
        found = np.array([[i for i in row if i != q][:k] for row, q in zip(found, queries)])  # leave-one-out
        return _average_precision_at_k(labels[found], labels[queries])

    exact = mean_ap("flat")
    assert exact == 1.0
    for kind in ("binary", "binary_weighted", "binary_two_stage"):
        assert mean_ap(kind) >= exact - 0.01, kind


def test_missing_results_and_empty_queries():
    gallery = _poincare_points(5, 8, seed=14)
    for kind in ("binary", "binary_weighted", "binary_two_stage"):
        distances, found = build_index(gallery, "poincare", kind, curv=CURV).search(gallery, 8)
        assert (found[:, 5:] == -1).all() and np.isinf(distances[:, 5:]).all()
        assert sorted(found[0, :5].tolist()) == list(range(5)) and distances[0, 0] == 0.0
    distances, found = build_index(gallery, "poincare", "binary", curv=CURV).search(np.zeros((0, 8)), 3)
    assert distances.shape == found.shape == (0, 3)


def test_errors_name_the_option():
    gallery = _poincare_points(100, 8, seed=15)
    cases = [
        ({"kind": "binary", "bits": 0}, "bits must be"),
        ({"kind": "binary_weighted", "bits": 9}, "bits must be"),
        ({"kind": "binary", "bits": "2"}, "bits must be"),
        ({"kind": "binary", "clip_percentile": 50}, "clip_percentile"),
        ({"kind": "binary_two_stage", "rerank": "exact"}, "rerank must be one of"),
        ({"kind": "binary_two_stage", "rerank_factor": 0}, "rerank_factor must be"),
        ({"kind": "binary_ivf", "codes": "dense", "nlist": 2}, "codes must be one of"),
        ({"kind": "binary_ivf", "nlist": 200}, "nlist=200"),
        ({"kind": "binary_ivf", "nlist": 4, "nprobe": 0}, "nprobe must be"),
        ({"kind": "binary", "nlist": 4}, "option 'nlist' does not apply to kind='binary'"),
        ({"kind": "binary_weighted", "rerank": "float"}, "option 'rerank' does not apply"),
        ({"kind": "binary_ivf", "pq_m": 4}, "option 'pq_m' does not apply"),
        ({"kind": "binary_flat"}, "kind must be one of"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            build_index(gallery, "poincare", curv=CURV, **options)
    with pytest.raises(ValueError, match="at least one embedding"):
        build_index(gallery[:0], "poincare", "binary", curv=CURV)
    with pytest.raises(ValueError, match="hi > lo"):
        build_index(np.full((10, 4), 0.3), "euclidean", "binary")
    with pytest.raises(ValueError, match="poincare.*ball"):
        build_index(gallery * 100, "poincare", "binary", curv=CURV)
    index = build_index(gallery, "poincare", "binary", curv=CURV)
    assert isinstance(index, BinaryIndex)
    with pytest.raises(ValueError, match="queries must have dimension 8"):
        index.search(np.zeros((2, 9)), 3)
    with pytest.raises(ValueError, match="k must be"):
        index.search(gallery[:2], 0)
    with pytest.raises(ValueError, match="nprobe applies to kind='binary_ivf' only"):
        index.set_search_params(nprobe=2)
    with pytest.raises(ValueError, match="rerank_factor applies to kind='binary_two_stage' only"):
        index.set_search_params(rerank_factor=2)
