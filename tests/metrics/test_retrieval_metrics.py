"""retrieval_metrics against an independent float64 numpy brute force (one query at a time)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from orchestrator.geometry.spaces import Space
from orchestrator.metrics import (
    cmc_at_k,
    default_chunk_size,
    mean_average_precision,
    paired_difference_standard_error,
    retrieval_metrics,
)

CURV = {Space.EUCLIDEAN: 1.0, Space.COSINE: 1.0, Space.LORENTZ: 0.7, Space.POINCARE: 1.3}


def _reference_distances(space: Space, q: np.ndarray, g: np.ndarray, curv: float) -> np.ndarray:
    """(N_q, N_g) float64 distances, written from the textbook formulas."""
    out = np.empty((q.shape[0], g.shape[0]))
    for i in range(q.shape[0]):
        for j in range(g.shape[0]):
            x, y = q[i], g[j]
            if space is Space.EUCLIDEAN:
                out[i, j] = np.sqrt(np.sum((x - y) ** 2))
            elif space is Space.COSINE:
                out[i, j] = 1.0 - x @ y / (np.linalg.norm(x) * np.linalg.norm(y))
            elif space is Space.LORENTZ:
                minkowski = -x[0] * y[0] + x[1:] @ y[1:]
                out[i, j] = np.arccosh(max(-curv * minkowski, 1.0)) / np.sqrt(curv)
            else:
                num = 2.0 * curv * np.sum((x - y) ** 2)
                den = (1.0 - curv * x @ x) * (1.0 - curv * y @ y)
                out[i, j] = np.arccosh(1.0 + num / den) / np.sqrt(curv)
    return out


def _reference_metrics(dist, q_labels, g_labels, ks, q_ids=None, g_ids=None):
    """Brute force: per query, drop same-id items, stable sort, walk the ranking."""
    hits = {k: 0 for k in ks}
    aps = []
    for i in range(dist.shape[0]):
        keep = np.ones(dist.shape[1], dtype=bool) if q_ids is None else g_ids != q_ids[i]
        d, labels = dist[i][keep], g_labels[keep]
        ranked = labels[np.argsort(d, kind="stable")] == q_labels[i]
        for k in ks:
            hits[k] += bool(ranked[:k].any())
        if ranked.any():
            found, precisions = 0, []
            for position, is_relevant in enumerate(ranked, start=1):
                if is_relevant:
                    found += 1
                    precisions.append(found / position)
            aps.append(sum(precisions) / ranked.sum())
    n = dist.shape[0]
    return {k: hits[k] / n for k in ks}, (float(np.mean(aps)) if aps else float("nan")), len(aps)


def _sklearn_map(dist, q_labels, g_labels, q_ids=None, g_ids=None):
    aps = []
    for i in range(dist.shape[0]):
        keep = np.ones(dist.shape[1], dtype=bool) if q_ids is None else g_ids != q_ids[i]
        truth = g_labels[keep] == q_labels[i]
        if truth.any():
            aps.append(average_precision_score(truth, -dist[i][keep]))
    return float(np.mean(aps))


def _points(space: Space, n: int, dim: int, rng: np.random.Generator, centers, labels, curv):
    """Points around class centres, valid in the space (Lorentz: time-first (n, dim + 1))."""
    x = centers[labels] + 0.5 * rng.standard_normal((n, dim))
    if space is Space.LORENTZ:
        x = 0.5 * x
        time = np.sqrt(1.0 / curv + np.sum(x**2, axis=1, keepdims=True))
        return np.concatenate([time, x], axis=1)
    if space is Space.POINCARE:
        # Map into the ball of radius 1/sqrt(curv), keeping directions.
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        return np.tanh(0.3 * norms) * x / norms / np.sqrt(curv)
    return x


def _dataset(space: Space, seed: int, n_query: int = 40, n_gallery: int = 60, dim: int = 5):
    rng = np.random.default_rng(seed)
    num_classes = 4
    curv = CURV[space]
    centers = rng.standard_normal((num_classes, dim))
    q_labels = rng.integers(0, num_classes, n_query)
    g_labels = rng.integers(0, num_classes, n_gallery)
    q = _points(space, n_query, dim, rng, centers, q_labels, curv)
    g = _points(space, n_gallery, dim, rng, centers, g_labels, curv)
    return q, g, q_labels, g_labels, curv


@pytest.mark.parametrize("space", list(Space))
@pytest.mark.parametrize("chunk_size", [None, 7])
def test_cross_retrieval_matches_brute_force(space, chunk_size):
    q, g, q_labels, g_labels, curv = _dataset(space, seed=1)
    dist = _reference_distances(space, q, g, curv)
    expected_cmc, expected_map, expected_valid = _reference_metrics(dist, q_labels, g_labels, (1, 5))

    result = retrieval_metrics(
        torch.from_numpy(q), torch.from_numpy(g), q_labels, g_labels, space,
        curv=curv, ks=(1, 5), chunk_size=chunk_size,
    )

    assert result.num_queries == len(q)
    assert result.num_queries_with_relevant == expected_valid
    assert result.cmc == pytest.approx(expected_cmc, abs=1e-12)
    assert result.mean_ap == pytest.approx(expected_map, abs=1e-12)
    assert result.mean_ap == pytest.approx(_sklearn_map(dist, q_labels, g_labels), abs=1e-10)
    # The sanity of the synthetic data: clustered classes retrieve far better than chance (~0.25).
    assert result.cmc[1] > 0.5


@pytest.mark.parametrize("space", list(Space))
@pytest.mark.parametrize("chunk_size", [None, 6])
def test_leave_one_out_self_retrieval_matches_brute_force(space, chunk_size):
    # Q = G: the same items, ids 100..; every query must not retrieve itself.
    _, g, _, g_labels, curv = _dataset(space, seed=2, n_gallery=50)
    ids = np.arange(100, 100 + len(g))
    dist = _reference_distances(space, g, g, curv)
    expected_cmc, expected_map, _ = _reference_metrics(dist, g_labels, g_labels, (1, 3), ids, ids)

    result = retrieval_metrics(
        g, g, g_labels, g_labels, space, curv=curv, ks=(1, 3),
        query_ids=ids, gallery_ids=ids, chunk_size=chunk_size,
    )

    assert result.cmc == pytest.approx(expected_cmc, abs=1e-12)
    assert result.mean_ap == pytest.approx(expected_map, abs=1e-12)
    assert result.mean_ap == pytest.approx(
        _sklearn_map(dist, g_labels, g_labels, ids, ids), abs=1e-10
    )
    # Without leave-one-out each query finds itself at distance 0.
    no_loo = retrieval_metrics(g, g, g_labels, g_labels, space, curv=curv, ks=(1,))
    assert no_loo.cmc[1] == 1.0
    assert result.cmc[1] < 1.0


def test_cross_retrieval_with_ids_removes_only_the_same_item():
    # New-model queries against the old-model gallery of the same images (HBCT §11 recommendation).
    q, g, q_labels, _, _ = _dataset(Space.EUCLIDEAN, seed=3, n_query=30, n_gallery=30)
    g_labels = q_labels
    ids = np.random.default_rng(0).permutation(30)
    dist = _reference_distances(Space.EUCLIDEAN, q, g, 1.0)
    expected_cmc, expected_map, _ = _reference_metrics(dist, q_labels, g_labels, (1, 5), ids, ids)

    result = retrieval_metrics(
        q, g, q_labels, g_labels, "euclidean", ks=(5, 1), query_ids=ids, gallery_ids=ids,
        chunk_size=4,
    )

    assert result.cmc == pytest.approx(expected_cmc, abs=1e-12)
    assert result.mean_ap == pytest.approx(expected_map, abs=1e-12)


def test_ties_are_broken_by_gallery_order():
    # Duplicated gallery points give exact ties; the stable sort puts the lower index first.
    rng = np.random.default_rng(4)
    base = rng.standard_normal((10, 3))
    g = np.concatenate([base, base, base[:5]])  # 25 items, many exact ties
    g_labels = rng.integers(0, 3, len(g))
    q = base[rng.integers(0, 10, 15)] + 1e-3 * rng.standard_normal((15, 3))
    q_labels = rng.integers(0, 3, len(q))
    dist = _reference_distances(Space.EUCLIDEAN, q, g, 1.0)
    expected_cmc, expected_map, _ = _reference_metrics(dist, q_labels, g_labels, (1, 2))

    result = retrieval_metrics(q, g, q_labels, g_labels, Space.EUCLIDEAN, ks=(1, 2), chunk_size=4)

    assert result.cmc == pytest.approx(expected_cmc, abs=1e-12)
    assert result.mean_ap == pytest.approx(expected_map, abs=1e-12)


def test_hand_computed_example():
    # 1-D gallery at 1, 2, 3, 4 with labels [0, 1, 0, 0]; query 0.0 with label 0.
    # Ranking: rel, not, rel, rel -> AP = (1/1 + 2/3 + 3/4) / 3 = 0.80555...
    g = np.array([[1.0], [2.0], [3.0], [4.0]])
    result = retrieval_metrics(np.array([[0.0]]), g, [0], [0, 1, 0, 0], "euclidean", ks=(1, 2))
    assert result.mean_ap == pytest.approx((1 + 2 / 3 + 3 / 4) / 3)
    assert result.cmc == {1: 1.0, 2: 1.0}
    # Leave-one-out removes gallery item id 7 (position 1): ranking not, rel, rel -> AP = (1/2 + 2/3)/2.
    result = retrieval_metrics(
        np.array([[0.0]]), g, [0], [0, 1, 0, 0], "euclidean", ks=(1, 2),
        query_ids=[7], gallery_ids=[7, 8, 9, 10],
    )
    assert result.mean_ap == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert result.cmc == {1: 0.0, 2: 1.0}


def test_queries_without_relevant_items_are_cmc_misses_and_skip_map():
    g = np.array([[0.0], [1.0], [2.0]])
    q = np.array([[0.1], [5.0]])
    # Query 0 (label 0) finds gallery item 0 first; query 1 has label 9, absent from the gallery.
    result = retrieval_metrics(q, g, [0, 9], [0, 1, 1], "euclidean", ks=(1, 3))
    assert result.cmc == {1: 0.5, 3: 0.5}
    assert result.mean_ap == pytest.approx(1.0)
    assert result.num_queries_with_relevant == 1
    none = retrieval_metrics(q, g, [5, 9], [0, 1, 1], "euclidean", ks=(1,))
    assert np.isnan(none.mean_ap) and none.cmc == {1: 0.0}


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_each_querys_average_precision_is_sklearns_and_nan_without_a_relevant_item(chunk_size):
    """The per-query APs (what the gate pairs) are scikit-learn's AP query by query, NaN for a query
    whose label the gallery lacks (after leave-one-out); mAP is their mean over the others."""
    _, g, _, g_labels, curv = _dataset(Space.EUCLIDEAN, seed=7, n_gallery=30)
    g_labels = g_labels.copy()
    g_labels[3] = 9  # the only item of class 9: with leave-one-out its query has nothing relevant
    ids = np.arange(len(g))
    dist = _reference_distances(Space.EUCLIDEAN, g, g, curv)
    result = retrieval_metrics(g, g, g_labels, g_labels, "euclidean", query_ids=ids, gallery_ids=ids,
                               chunk_size=chunk_size)
    expected = np.full(len(g), np.nan)
    for i in range(len(g)):
        keep = ids != i
        truth = g_labels[keep] == g_labels[i]
        if truth.any():
            expected[i] = average_precision_score(truth, -dist[i][keep])
    assert result.average_precisions.shape == (len(g),) and np.isnan(result.average_precisions[3])
    np.testing.assert_allclose(result.average_precisions, expected, atol=1e-12)
    assert result.mean_ap == pytest.approx(np.nanmean(expected), abs=1e-12)
    assert result.num_queries_with_relevant == len(g) - 1


def test_the_paired_standard_error_is_scipys_sem_of_the_differences_where_both_are_defined():
    from scipy.stats import sem

    rng = np.random.default_rng(3)
    before = rng.uniform(size=200)
    after = before + 0.01 + 0.02 * rng.standard_normal(200)  # moves with before: a small paired error
    after[5], before[9] = np.nan, np.nan  # two queries without a relevant item on one side
    both = ~(np.isnan(after) | np.isnan(before))
    se = paired_difference_standard_error(after, before)
    assert se == pytest.approx(sem(after[both] - before[both]), rel=1e-12)
    unpaired = np.sqrt(np.var(after[both], ddof=1) / both.sum() + np.var(before[both], ddof=1) / both.sum())
    assert se < unpaired / 5  # the point of pairing
    assert paired_difference_standard_error(np.array([0.5, np.nan]), np.array([0.4, 0.3])) is None
    with pytest.raises(ValueError, match=r"\(N_q,\) of one length"):
        paired_difference_standard_error(np.zeros(3), np.zeros(4))


def test_wrappers_and_float32_inputs_agree_with_retrieval_metrics():
    q, g, q_labels, g_labels, curv = _dataset(Space.COSINE, seed=5)
    full = retrieval_metrics(q, g, q_labels, g_labels, "cosine", ks=(5,))
    assert cmc_at_k(q, g, q_labels, g_labels, "cosine", k=5) == full.cmc[5]
    assert mean_average_precision(q, g, q_labels, g_labels, "cosine", chunk_size=3) == pytest.approx(
        full.mean_ap, abs=1e-12
    )
    as_float32 = retrieval_metrics(
        q.astype(np.float32), g.astype(np.float32), q_labels, g_labels, "cosine", ks=(5,)
    )
    assert as_float32.mean_ap == pytest.approx(full.mean_ap, abs=1e-4)


def test_default_chunk_size_fits_a_million_item_gallery_in_about_a_gibibyte():
    chunk = default_chunk_size(10**6)
    assert chunk >= 1
    assert chunk * 10**6 * 4 <= 256 * 2**20  # distances of one chunk: at most 256 MiB
    assert default_chunk_size(10) > default_chunk_size(10**4)
    assert default_chunk_size(10**12) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gallery": np.zeros((4, 3))}, "gallery"),
        ({"queries": np.zeros(2)}, "queries"),
        ({"query_labels": [0, 1, 2]}, "query_labels"),
        ({"gallery_labels": [0.5, 1.0, 0.0, 1.0]}, "gallery_labels"),
        ({"query_ids": [0, 1]}, "query_ids"),
        ({"query_ids": [0, 1], "gallery_ids": [0, 1, 2]}, "gallery_ids"),
        ({"space": "spherical"}, "space"),
        ({"ks": (0, 1)}, "ks"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"queries": np.array([[np.nan, 0.0], [0.0, 0.0]])}, "queries"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(kwargs, message):
    args = {
        "queries": np.zeros((2, 2)),
        "gallery": np.ones((4, 2)),
        "query_labels": [0, 1],
        "gallery_labels": [0, 1, 0, 1],
        "space": "euclidean",
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        retrieval_metrics(**args)


# --- metrics of top-K lists (what a search returns) ------------------------------------------------

def test_ranked_list_metrics_over_the_whole_ranking_equal_retrieval_metrics():
    from orchestrator.metrics import ranked_list_metrics

    rng = np.random.default_rng(11)
    queries, gallery = rng.normal(size=(25, 4)), rng.normal(size=(40, 4))
    q_labels, g_labels = rng.integers(0, 5, 25), rng.integers(0, 5, 40)
    expected = retrieval_metrics(queries, gallery, q_labels, g_labels, "euclidean", ks=(1, 5))
    order = np.argsort(((queries[:, None] - gallery[None]) ** 2).sum(-1), axis=1, kind="stable")
    relevant = np.array([(g_labels == label).sum() for label in q_labels])
    result = ranked_list_metrics(g_labels[order], q_labels, relevant, ks=(1, 5))
    assert result.cmc == pytest.approx(expected.cmc)
    assert result.mean_ap == pytest.approx(expected.mean_ap)
    np.testing.assert_allclose(result.average_precisions, expected.average_precisions, atol=1e-12)


def test_ranked_list_metrics_at_a_cutoff_normalise_by_all_relevant_items():
    from orchestrator.metrics import ranked_list_metrics

    # query label 1: hits at ranks 1 and 3 of the top 3, R = 4 relevant items in the gallery
    result = ranked_list_metrics(np.array([[1, 0, 1], [2, -1, -1]]), np.array([1, 2]), np.array([4, 1]), ks=(1, 3))
    assert result.mean_ap == pytest.approx(((1 / 1 + 2 / 3) / 4 + 1.0) / 2)
    assert result.cmc == {1: 1.0, 3: 1.0}
    with pytest.raises(ValueError, match="CMC@5 needs at least 5 hits"):
        ranked_list_metrics(np.array([[1, 0, 1]]), np.array([1]), np.array([2]), ks=(5,))
