"""d-Simplex prototypes (stationary_dsimplex.md §4.1, §12)."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.geometry.simplex import dsimplex_vertices


@pytest.mark.parametrize("num_classes", [2, 4, 10, 1024])
@pytest.mark.parametrize(
    ("normalization", "row_norm"), [("unit", lambda k: 1.0), ("frobenius", lambda k: 1.0 / math.sqrt(k))]
)
def test_regular_simplex_geometry(num_classes, normalization, row_norm):
    w = dsimplex_vertices(num_classes, normalization=normalization)
    assert w.shape == (num_classes, num_classes - 1) and w.dtype == torch.float32
    w64 = w.double()
    norms = w64.norm(dim=1)
    torch.testing.assert_close(norms, torch.full_like(norms, row_norm(num_classes)), rtol=1e-6, atol=0)
    unit = w64 / norms[:, None]
    cosine = unit @ unit.T
    off_diagonal = cosine[~torch.eye(num_classes, dtype=torch.bool)]
    assert (off_diagonal + 1.0 / (num_classes - 1)).abs().max() < 1e-6
    assert w64.sum(dim=0).abs().max() < 1e-6  # the prototypes sum to the zero vector


def test_matches_the_released_reference_construction():
    """The float32 reference code of the spec (§4.1), built independently here."""
    k = 10
    n = k - 1
    t = torch.zeros(n + 1, n)
    t[:-1, :] = torch.eye(n)
    t[-1, :] += (1.0 - math.sqrt(1.0 + n)) / n
    t -= t.mean(dim=0, keepdim=True)
    t /= t.norm(p=2, dim=1, keepdim=True) + 1e-8
    torch.testing.assert_close(dsimplex_vertices(k), t, rtol=1e-6, atol=1e-7)


def test_rebuild_is_bit_identical_and_dtype_device_are_honoured():
    first = dsimplex_vertices(100)
    second = dsimplex_vertices(100)
    assert torch.equal(first, second)
    w64 = dsimplex_vertices(100, dtype=torch.float64, device="cpu")
    assert w64.dtype == torch.float64
    assert torch.equal(w64.float(), first)


@pytest.mark.parametrize("bad", [1, 0, -3, 2.0, True])
def test_rejects_bad_num_classes(bad):
    with pytest.raises(ValueError, match="num_classes"):
        dsimplex_vertices(bad)


def test_rejects_unknown_normalization():
    with pytest.raises(ValueError, match="'l1'"):
        dsimplex_vertices(5, normalization="l1")
