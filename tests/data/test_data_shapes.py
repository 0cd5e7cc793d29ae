"""The generated ``shapes`` source: deterministic, the advertised classes, held-out background styles."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.config import load_pipeline
from orchestrator.data import load_shapes, load_source
from orchestrator.data.procedural import PATTERNS, SHAPES, STYLES, render_shapes, split_styles

SMALL = dict(image_size=16, num_shapes=4, num_patterns=3, train_per_class=5, test_per_class=3, test_styles=2)


def test_same_seed_same_bytes_other_seed_other_images():
    first, again = load_shapes("train", **SMALL), load_shapes("train", **SMALL)
    np.testing.assert_array_equal(first.images, again.images)
    np.testing.assert_array_equal(first.labels, again.labels)
    other = load_shapes("train", seed=1, **SMALL)
    assert np.abs(first.images.astype(int) - other.images.astype(int)).mean() > 10


def test_class_count_balance_names_and_ids():
    train, test = load_shapes("train", **SMALL), load_shapes("test", **SMALL)
    assert train.num_classes == test.num_classes == 12
    assert train.images.shape == (60, 16, 16, 3) and test.images.shape == (36, 16, 16, 3)
    np.testing.assert_array_equal(np.bincount(train.labels), np.full(12, 5))
    np.testing.assert_array_equal(np.bincount(test.labels), np.full(12, 3))
    assert train.class_names[:4] == [f"{SHAPES[0]}/{p}" for p in PATTERNS[:3]] + [f"{SHAPES[1]}/{PATTERNS[0]}"]
    assert not set(train.ids) & set(test.ids)
    np.testing.assert_array_equal(test.ids, 60 + np.arange(36))


def test_default_source_has_48_classes_and_loads_by_name():
    data = load_source("shapes", split="test", test_per_class=1)
    assert data.num_classes == len(SHAPES[:8]) * len(PATTERNS) == 48 and len(data) == 48


def test_splits_are_disjoint_in_background_style():
    train = render_shapes("train", image_size=16, num_shapes=2, num_patterns=2, per_class=40, test_styles=2)
    test = render_shapes("test", image_size=16, num_shapes=2, num_patterns=2, per_class=40, test_styles=2)
    assert set(train.style.tolist()) == set(range(len(STYLES) - 2))  # every training style is used
    assert set(test.style.tolist()) == {len(STYLES) - 2, len(STYLES) - 1}
    np.testing.assert_array_equal(train.labels, train.shape * 2 + train.pattern)


def test_the_object_differs_from_its_background():
    """A flat-background image is uniform far from its object: the class lives in the object."""
    rendered = render_shapes("train", image_size=32, num_shapes=1, num_patterns=1, per_class=60, test_styles=7)
    assert set(rendered.style.tolist()) == {0}  # only "flat" is left for training
    images = rendered.images.astype(float)
    spread = images.reshape(60, -1, 3).std(axis=1).mean()
    noise_only = 0.04 * 255
    assert spread > 2 * noise_only  # object and background differ well beyond the pixel noise


@pytest.mark.parametrize("kwargs, message", [
    (dict(split="val"), "split: expected 'train' or 'test', got 'val'"),
    (dict(test_styles=8), "test_styles: expected an int in [1, 7], got 8"),
    (dict(num_shapes=11), "num_shapes: expected an int in [1, 10], got 11"),
    (dict(train_per_class=0), "train_per_class: expected an int in [1, 100000], got 0"),
])
def test_bad_options_name_the_option(kwargs, message):
    with pytest.raises(ValueError) as error:
        load_shapes(**{"split": "train", **kwargs})
    assert str(error.value) == message


def test_split_styles_rejects_bad_split():
    with pytest.raises(ValueError, match="split: expected"):
        split_styles("all", 2)


def test_shapes_pipeline_uses_the_source():
    config = load_pipeline(Path(__file__).resolve().parents[2] / "pipelines" / "shapes.yaml")
    assert config.data.source == "shapes" and config.data.eval_split == "test"
    assert {g.method.name for g in config.generations} == {"hbct"}
