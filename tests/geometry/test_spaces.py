"""Retrieval distances per embedding space (``Geometry.pairwise_distance``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from orchestrator.geometry import Geometry, Space, lorentz, poincare


def pairwise_distance(space, queries, gallery, curv=1.0):
    return Geometry(space, curv).pairwise_distance(queries, gallery)


def _random(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_euclidean_matches_brute_force():
    q, g = _random(7, 5, 0), _random(9, 5, 1)
    brute = np.sqrt(((q.numpy()[:, None, :] - g.numpy()[None, :, :]) ** 2).sum(-1))
    np.testing.assert_allclose(pairwise_distance(Space.EUCLIDEAN, q, g).numpy(), brute, rtol=1e-10)


def test_cosine_is_one_minus_cosine_and_handles_zero_vectors():
    q, g = _random(6, 4, 2), _random(8, 4, 3)
    q[0] = 0.0
    d = pairwise_distance("cosine", q, g)
    qn, gn = q.numpy(), g.numpy()
    for i in range(1, 6):
        for j in range(8):
            cos = qn[i] @ gn[j] / (np.linalg.norm(qn[i]) * np.linalg.norm(gn[j]))
            assert d[i, j].item() == pytest.approx(1.0 - cos, abs=1e-12)
    assert torch.equal(d[0], torch.ones(8, dtype=torch.float64))
    assert d.min() >= 0.0 and d.max() <= 2.0


@pytest.mark.parametrize("curv", [0.5, 1.0])
def test_hyperbolic_spaces_delegate_to_elementwise_geodesics(curv):
    q = lorentz.expmap0(_random(5, 3, 4), curv)
    g = lorentz.expmap0(_random(6, 3, 5), curv)
    d = pairwise_distance(Space.LORENTZ, q, g, curv=curv)
    torch.testing.assert_close(d, lorentz.distance(q[:, None, :], g[None, :, :], curv))

    pq, pg = lorentz.to_poincare(q, curv), lorentz.to_poincare(g, curv)
    d_ball = pairwise_distance("poincare", pq, pg, curv=curv)
    torch.testing.assert_close(d_ball, d)  # the two models are isometric


def test_smaller_is_closer_in_every_space():
    anchor = torch.tensor([[0.3, 0.1]], dtype=torch.float64)
    gallery = torch.tensor([[0.31, 0.1], [-0.3, -0.1]], dtype=torch.float64)
    for space in Space:
        if space is Space.LORENTZ:
            d = pairwise_distance(space, lorentz.expmap0(anchor, 1.0), lorentz.expmap0(gallery, 1.0))
        else:
            d = pairwise_distance(space, anchor, gallery)
        assert d[0, 0] < d[0, 1], space
    assert math.isclose(pairwise_distance("euclidean", anchor, gallery)[0, 0].item(), 0.01, rel_tol=1e-9)
    assert poincare.distance(anchor, gallery[:1], 1.0) > 0


def test_string_values_are_accepted_and_unknown_values_rejected():
    assert Space.parse("lorentz") is Space.LORENTZ
    assert Space.parse(Space.COSINE) is Space.COSINE
    with pytest.raises(ValueError, match="'hamming'"):
        pairwise_distance("hamming", _random(2, 3, 6), _random(2, 3, 7))


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="queries"):
        pairwise_distance(Space.EUCLIDEAN, _random(2, 3, 8), _random(2, 4, 9))
