"""BitPlaneQuantizer: spec §4.1's worked example, the fitted range, the code layouts and their sizes."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.index.bitplane import BitPlaneQuantizer, plane_weights
from orchestrator.index.hamming import weighted_hamming

# binary_hyperbolic.md §4.1: r = 1 (range [-1, 1]), n = 2, s = 2/3
X = np.array([[-0.9, -0.2, 0.3, 0.95]])
Y = np.array([[0.9, -0.2, -0.9, 0.3]])


@pytest.fixture
def example():
    return BitPlaneQuantizer(bits=2, lo=-1.0, hi=1.0, dim=4)


def test_worked_example_integers_and_planes(example):
    assert example.step == pytest.approx(2.0 / 3.0)
    assert example.integers(X).tolist() == [[0, 1, 2, 3]]
    assert example.integers(Y).tolist() == [[3, 1, 0, 2]]
    assert example.planes(X).tolist() == [[[0, 0, 1, 1], [0, 1, 0, 1]]]  # MSB plane, LSB plane
    assert example.planes(Y).tolist() == [[[1, 0, 0, 1], [1, 1, 0, 0]]]


def test_worked_example_distances(example):
    # plain code: 2 planes of 4 bits, each padded to one byte, MSB plane first, big bit order
    assert example.plain_codes(X).tolist() == [[0b0011_0000, 0b0101_0000]]
    assert example.plain_codes(Y).tolist() == [[0b1001_0000, 0b1100_0000]]
    differing = np.unpackbits(example.plain_codes(X) ^ example.plain_codes(Y)).sum()
    assert differing == 4  # MSB plane 2 + LSB plane 2: unweighted Hamming
    # weighted code: MSB plane 4 times, LSB plane once; its plain Hamming is d_H^Σ = 4·2 + 1·2 = 10
    assert example.weighted_codes(X).tolist() == [[0b0011_0000] * 4 + [0b0101_0000]]
    assert np.unpackbits(example.weighted_codes(X) ^ example.weighted_codes(Y)).sum() == 10
    assert weighted_hamming(example.plain_codes(X), example.plain_codes(Y)[None], bits=2).tolist() == [[10]]
    # the float form: squared L2 = s² d_H^Σ = (4/9)·10 (the integer codes' squared L2 would be 14)
    diff = example.plane_vectors(X).astype(np.float64) - example.plane_vectors(Y)
    assert (diff**2).sum() == pytest.approx(10 * 4 / 9, rel=1e-6)


def test_fit_uses_the_global_range_or_percentiles():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((500, 7))
    q = BitPlaneQuantizer.fit(x, bits=3)
    assert (q.lo, q.hi, q.dim, q.bits) == (x.min(), x.max(), 7, 3)
    assert q.step == pytest.approx((x.max() - x.min()) / 7)
    clipped = BitPlaneQuantizer.fit(x, bits=2, clip_percentile=1.0)
    assert clipped.lo == pytest.approx(np.sort(x.ravel())[int(0.01 * (x.size - 1))], abs=0.05)
    assert x.min() < clipped.lo < clipped.hi < x.max()
    # values beyond the range go to the end levels
    assert clipped.integers(np.array([[-100.0] * 7, [100.0] * 7])).tolist() == [[0] * 7, [3] * 7]


@pytest.mark.parametrize("bits", [1, 2, 3])
def test_codes_match_an_independent_quantisation(bits):
    rng = np.random.default_rng(bits)
    x = rng.uniform(-0.3, 0.5, size=(50, 13))  # 13: planes are padded to 2 bytes each
    q = BitPlaneQuantizer.fit(x, bits=bits)
    step = (x.max() - x.min()) / (2**bits - 1)
    ints = np.clip(np.floor((x - x.min()) / step + 0.5), 0, 2**bits - 1).astype(int)
    np.testing.assert_array_equal(q.integers(x), ints)
    # unpack the plain code plane by plane and rebuild the integers MSB first
    bits_per_plane = np.unpackbits(q.plain_codes(x), axis=1).reshape(50, bits, 16)
    assert not bits_per_plane[:, :, 13:].any()  # zero padding
    rebuilt = sum(bits_per_plane[:, i, :13].astype(int) << (bits - 1 - i) for i in range(bits))
    np.testing.assert_array_equal(rebuilt, ints)
    # weighted code: plane i (MSB first) repeated 4^(n-i) times
    weighted = np.unpackbits(q.weighted_codes(x), axis=1).reshape(50, -1, 16)
    repeats = [4 ** (bits - 1 - i) for i in range(bits)]
    assert weighted.shape[1] == sum(repeats) == (4**bits - 1) // 3
    np.testing.assert_array_equal(weighted, np.repeat(bits_per_plane, repeats, axis=1))


@pytest.mark.parametrize("bits, plain, weighted", [(1, 16, 16), (2, 32, 80), (3, 48, 336)])
def test_code_sizes_for_128_dimensions(bits, plain, weighted):
    q = BitPlaneQuantizer(bits=bits, lo=0.0, hi=1.0, dim=128)
    assert q.plain_code_bytes == plain == 128 * bits // 8
    assert q.weighted_code_bytes == weighted == 128 * (4**bits - 1) // 24
    assert plane_weights(bits).tolist() == [4 ** (bits - i) for i in range(1, bits + 1)]


def test_dict_round_trip_and_errors():
    q = BitPlaneQuantizer.fit(np.random.default_rng(1).standard_normal((20, 3)), bits=4)
    assert BitPlaneQuantizer.from_dict(q.to_dict()) == q
    for bad in (0, 9, 2.0, "2", True):
        with pytest.raises(ValueError, match="bits must be"):
            BitPlaneQuantizer.fit(np.ones((2, 2)) * [0, 1], bits=bad)
    for bad in (-1, 50, "1", float("nan")):
        with pytest.raises(ValueError, match="clip_percentile"):
            BitPlaneQuantizer.fit(np.ones((2, 2)) * [0, 1], clip_percentile=bad)
    with pytest.raises(ValueError, match="hi > lo"):
        BitPlaneQuantizer.fit(np.full((5, 3), 0.25))
    with pytest.raises(ValueError, match="at least one"):
        BitPlaneQuantizer.fit(np.zeros((0, 3)))
    with pytest.raises(ValueError, match=r"coordinates must be \(N, 3\)"):
        q.integers(np.zeros((2, 4)))
