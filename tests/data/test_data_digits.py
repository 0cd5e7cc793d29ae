"""The embedded default dataset: scikit-learn's digits, upscaled, RGB, stratified split."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from sklearn.datasets import load_digits as sklearn_digits

from orchestrator.data import load_digits, load_source
from orchestrator.data.sources import bundled_digits

REFERENCE = sklearn_digits()


def bilinear_matrix(src: int, dst: int) -> np.ndarray:
    """(dst, src) 1-D bilinear interpolation with half-pixel centres and clamped edges."""
    matrix = np.zeros((dst, src))
    for i in range(dst):
        x = min(max((i + 0.5) * src / dst - 0.5, 0.0), src - 1)
        lo = int(math.floor(x))
        hi = min(lo + 1, src - 1)
        matrix[i, lo] += 1 - (x - lo)
        matrix[i, hi] += x - lo
    return matrix


def test_shapes_dtype_and_value_range():
    train, test = load_digits("train"), load_digits("test")
    assert train.images.shape == (1258, 32, 32, 3) and test.images.shape == (539, 32, 32, 3)
    assert train.images.dtype == np.uint8
    assert train.images.min() == 0 and train.images.max() == 255
    np.testing.assert_array_equal(train.images[..., 0], train.images[..., 2])
    assert train.class_names == [str(d) for d in range(10)]


def test_native_size_is_the_scaled_original():
    data = load_digits("all", image_size=8)
    expected = np.round(REFERENCE.images * 255 / 16).astype(np.uint8)
    np.testing.assert_array_equal(data.images[..., 1], expected)
    np.testing.assert_array_equal(data.ids, np.arange(1797))
    np.testing.assert_array_equal(data.labels, REFERENCE.target)


def test_upscaling_matches_independent_bilinear_reference():
    data = load_digits("all", image_size=32)
    weights = bilinear_matrix(8, 32)
    for index in (0, 17, 1796):
        expected = weights @ (REFERENCE.images[index] * 255 / 16) @ weights.T
        assert np.abs(data.images[index, :, :, 0].astype(float) - expected).max() <= 0.5 + 1e-9


def test_split_is_stratified_disjoint_and_complete():
    train, test = load_digits("train"), load_digits("test")
    assert set(train.ids).isdisjoint(test.ids)
    np.testing.assert_array_equal(np.sort(np.concatenate([train.ids, test.ids])), np.arange(1797))
    np.testing.assert_array_equal(test.labels, REFERENCE.target[test.ids])
    per_class = np.bincount(REFERENCE.target)
    test_counts = np.bincount(test.labels, minlength=10)
    np.testing.assert_array_equal(np.bincount(train.labels, minlength=10) + test_counts, per_class)
    assert np.all(np.abs(test_counts - 0.3 * per_class) < 1)
    assert test_counts.sum() == round(0.3 * 1797)


def test_split_is_deterministic_in_seed():
    first, again, other = load_digits("test", seed=0), load_digits("test", seed=0), load_digits("test", seed=1)
    np.testing.assert_array_equal(first.ids, again.ids)
    np.testing.assert_array_equal(first.images, again.images)
    assert not np.array_equal(first.ids, other.ids)


def test_registry_and_bad_arguments():
    assert len(load_source("digits", split="test", image_size=16)) == 539
    with pytest.raises(ValueError, match="split"):
        load_digits("validation")
    with pytest.raises(ValueError, match="test_fraction"):
        load_digits("train", test_fraction=1.0)
    with pytest.raises(ValueError, match="image_size"):
        load_digits("train", image_size=0)


def test_the_bundled_file_read_here_is_scikit_learns_load_digits():
    images, targets = bundled_digits()
    np.testing.assert_array_equal(images, REFERENCE.images)
    np.testing.assert_array_equal(targets, REFERENCE.target)
    assert images.dtype == REFERENCE.images.dtype and not images.flags.writeable


def test_loading_the_digits_imports_neither_scikit_learn_nor_scipy():
    code = ("import sys; from orchestrator.data import load_digits; load_digits('test'); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'scipy'}))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.strip() == "[]"
