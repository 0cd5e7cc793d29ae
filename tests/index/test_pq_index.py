"""PQIndex: the distances are PQ's asymmetric squared L2 to the stored reconstructions, the bit budget,
the binary codes fed as plane vectors, and option errors."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
import torch

from orchestrator.geometry import poincare
from orchestrator.index import PQIndex, build_index

CURV = 0.1


def _points(n: int, d: int, seed: int) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    return poincare.expmap0(0.5 * torch.randn(n, d, generator=gen, dtype=torch.float64), CURV).to(torch.float32).numpy()


def _reconstructions(index: PQIndex) -> np.ndarray:
    """(N, D_vec) decoded vectors, in the input space of the index (OPQ's rotation undone)."""
    return index.index.reconstruct_n(0, index.ntotal).astype(np.float64)


@pytest.fixture(scope="module")
def data():
    return _points(1200, 16, seed=1), _points(20, 16, seed=2)


@pytest.mark.parametrize("kind", ["pq", "opq"])
def test_distances_are_squared_l2_to_the_reconstruction(data, kind):
    gallery, queries = data
    ids = np.arange(1200) * 2 + 1
    index = build_index(gallery, "poincare", kind, ids=ids, curv=CURV)
    assert isinstance(index, PQIndex) and index.pq_m == 4 and index.code_bytes == 4  # 2 bits x 16 dims
    distances, found = index.search(queries, 10)
    reference = ((queries[:, None, :].astype(np.float64) - _reconstructions(index)[None]) ** 2).sum(axis=-1)
    np.testing.assert_allclose(distances, np.sort(reference, axis=1)[:, :10], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(np.take_along_axis(reference, (found - 1) // 2, axis=1), distances, rtol=1e-4, atol=1e-7)
    # the approximation is close to the true squared L2 of the Poincaré coordinates for the found items
    true = ((queries[:, None, :] - gallery[(found - 1) // 2]) ** 2).sum(axis=-1)
    assert np.median(np.abs(distances - true) / true) < 0.5
    assert index.memory_bytes == 1200 * (4 + 8) + 256 * 16 * 4 + (16 * 16 * 4 if kind == "opq" else 0)


def test_binary_opq_encodes_the_plane_vectors(data):
    gallery, queries = data
    index = build_index(gallery, "poincare", "binary_opq", curv=CURV, bits=2)
    quantizer = index.quantizer
    assert index.pq_m == 4 and index.code_bytes == 4 == quantizer.plain_code_bytes  # same bits as the binary code
    vectors = quantizer.plane_vectors(gallery).astype(np.float64)
    q_vectors = quantizer.plane_vectors(queries).astype(np.float64)
    # plane vectors: squared L2 = s² d_H^Σ, the binary_weighted distance
    weighted_d, weighted_i = build_index(gallery, "poincare", "binary_weighted", curv=CURV).search(queries, 5)
    np.testing.assert_allclose(((q_vectors[:, None] - vectors[weighted_i]) ** 2).sum(-1), weighted_d, rtol=1e-5)
    # the index returns squared L2 from the query's plane vector to the decoded plane vectors
    distances, found = index.search(queries, 10)
    reference = ((q_vectors[:, None, :] - _reconstructions(index)[None]) ** 2).sum(axis=-1)
    np.testing.assert_allclose(np.take_along_axis(reference, found, axis=1), distances, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(distances, np.sort(reference, axis=1)[:, :10], rtol=1e-4, atol=1e-7)


def test_options_and_training_sample(data):
    gallery, _ = data
    index = build_index(gallery, "poincare", "pq", curv=CURV, pq_m=8, pq_nbits=6, train_size=300, seed=3)
    assert (index.pq_m, index.pq_nbits, index.code_bytes) == (8, 6, 6)  # 8 x 6 bits = 48 bits
    again = build_index(gallery, "poincare", "pq", curv=CURV, pq_m=8, pq_nbits=6, train_size=300, seed=3)
    np.testing.assert_array_equal(faiss.vector_to_array(index.index.pq.centroids),
                                  faiss.vector_to_array(again.index.pq.centroids))
    assert build_index(gallery, "euclidean", "pq", pq_m=16).code_bytes == 16


def test_errors_name_the_option(data):
    gallery, _ = data
    cases = [
        ({"kind": "pq", "pq_m": 5}, "pq_m must divide the vector dimension 16"),
        ({"kind": "binary_opq", "pq_m": 5}, "pq_m must divide the vector dimension 32"),
        ({"kind": "opq", "pq_m": 0}, "pq_m must be"),
        ({"kind": "pq", "pq_nbits": 0}, "pq_nbits must be"),
        ({"kind": "pq", "pq_nbits": 17}, "pq_nbits must be"),
        ({"kind": "pq", "train_size": 100}, "train_size must be >= 2"),
        ({"kind": "pq", "seed": -1}, "seed must be"),
        ({"kind": "binary_opq", "bits": 0}, "bits must be"),
        ({"kind": "pq", "bits": 2}, "option 'bits' does not apply to kind='pq'"),
        ({"kind": "opq", "rerank": "float"}, "option 'rerank' does not apply"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            build_index(gallery, "poincare", curv=CURV, **options)
    with pytest.raises(ValueError, match="at least 2\\^pq_nbits = 256 embeddings"):
        build_index(gallery[:200], "poincare", "pq", curv=CURV)
