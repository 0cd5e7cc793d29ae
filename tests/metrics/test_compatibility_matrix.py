"""compatibility_matrix on synthetic generations, checked against direct retrieval_metrics calls."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.geometry.spaces import Space
from orchestrator.metrics import (
    GenerationEmbeddings,
    average_compatibility,
    compatibility_matrices,
    compatibility_matrix,
    retrieval_metrics,
)

NUM_ITEMS, NUM_CLASSES, DIM, NUM_GENERATIONS = 100, 10, 8, 3


def _labels_and_ids():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, NUM_CLASSES, NUM_ITEMS)
    ids = np.arange(NUM_ITEMS) + 1000
    return labels, ids


def _clustered(rng, labels, centers):
    return centers[labels] + 0.5 * rng.standard_normal((len(labels), DIM))


def _lorentz(x, curv):
    time = np.sqrt(1.0 / curv + np.sum(x**2, axis=1, keepdims=True))
    return np.concatenate([time, x], axis=1)


def _generations(labels, shared: bool, space: Space, curv: float = 1.0):
    """Q = G = the same items. ``shared``: every generation is the first up to 1e-4 noise;
    otherwise each has its own class centres (clustered, but in unrelated positions)."""
    rng = np.random.default_rng(1)
    base = _clustered(rng, labels, rng.standard_normal((NUM_CLASSES, DIM)))
    gens = []
    for _ in range(NUM_GENERATIONS):
        if shared:
            x = base + 1e-4 * rng.standard_normal(base.shape)
        else:
            x = _clustered(rng, labels, 3.0 * rng.standard_normal((NUM_CLASSES, DIM)))
        if space is Space.LORENTZ:
            x = _lorentz(0.5 * x, curv)
        gens.append(GenerationEmbeddings(queries=x, gallery=x.copy(), space=space, curv=curv))
    return gens


@pytest.mark.parametrize(("space", "curv"), [(Space.EUCLIDEAN, 1.0), (Space.LORENTZ, 0.5)])
@pytest.mark.parametrize("shared", [True, False])
def test_matrix_entries_equal_direct_retrieval_calls(space, curv, shared):
    labels, ids = _labels_and_ids()
    gens = _generations(labels, shared, space, curv)

    matrices = compatibility_matrices(
        gens, labels, labels, query_ids=ids, gallery_ids=ids, ks=(1, 5), chunk_size=16
    )

    assert set(matrices) == {"cmc@1", "cmc@5", "map"}
    for t in range(NUM_GENERATIONS):
        for k in range(NUM_GENERATIONS):
            if k > t:
                assert all(np.isnan(m[t, k]) for m in matrices.values())
                continue
            direct = retrieval_metrics(
                gens[t].queries, gens[k].gallery, labels, labels, space, curv=curv,
                ks=(1, 5), query_ids=ids, gallery_ids=ids,
            )
            assert matrices["cmc@1"][t, k] == pytest.approx(direct.cmc[1], abs=1e-12)
            assert matrices["cmc@5"][t, k] == pytest.approx(direct.cmc[5], abs=1e-12)
            assert matrices["map"][t, k] == pytest.approx(direct.mean_ap, abs=1e-12)

    diagonal = np.diag(matrices["map"])
    off_diagonal = matrices["map"][np.tril_indices(NUM_GENERATIONS, k=-1)]
    assert diagonal.min() > 0.6  # clustered classes: every self-test retrieves well
    if shared:
        # The gallery generation equals the query generation up to tiny noise: cross ≈ self.
        assert off_diagonal.min() > diagonal.min() - 0.02
    else:
        # Unrelated generations: cross retrieval is near chance (class frequency ≈ 0.1).
        assert off_diagonal.max() < 0.3


def test_single_metric_matrix_and_ac_for_shared_vs_independent_generations():
    labels, ids = _labels_and_ids()
    shared = compatibility_matrix(
        _generations(labels, True, Space.COSINE), labels, labels, metric="cmc@1",
        query_ids=ids, gallery_ids=ids,
    )
    independent = compatibility_matrix(
        _generations(labels, False, Space.COSINE), labels, labels, metric="map",
        query_ids=ids, gallery_ids=ids,
    )
    assert shared.shape == independent.shape == (NUM_GENERATIONS, NUM_GENERATIONS)
    assert average_compatibility(independent) == 0.0
    # Tuples are accepted as generations too.
    as_tuples = [(g.queries, g.gallery, "cosine") for g in _generations(labels, True, Space.COSINE)]
    np.testing.assert_array_equal(
        compatibility_matrix(as_tuples, labels, labels, metric="cmc@1", query_ids=ids, gallery_ids=ids),
        shared,
    )


def test_cross_space_and_cross_curvature_pairs_raise():
    labels, _ = _labels_and_ids()
    euclidean = _generations(labels, True, Space.EUCLIDEAN)[0]
    cosine = euclidean._replace(space=Space.COSINE)
    with pytest.raises(ValueError, match="different spaces"):
        compatibility_matrices([euclidean, cosine], labels, labels)
    lorentz_a, lorentz_b = _generations(labels, True, Space.LORENTZ, 1.0)[:2]
    with pytest.raises(ValueError, match="different curvatures"):
        compatibility_matrices([lorentz_a, lorentz_b._replace(curv=0.5)], labels, labels)
    with pytest.raises(ValueError, match="metric"):
        compatibility_matrix([euclidean], labels, labels, metric="recall")
    with pytest.raises(ValueError, match=r"generations\[1\]"):
        compatibility_matrices([euclidean, "not a generation"], labels, labels)
