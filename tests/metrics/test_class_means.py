"""Distances to the class means (λ-orthogonality §2.11), the one implementation behind the backfill
order, against the distances written out item by item, whole and shard by shard."""
from __future__ import annotations

import numpy as np
import pytest

from orchestrator.metrics.class_means import class_mean_distances, class_sums, combine_class_sums, distances_to_class_means


@pytest.mark.parametrize("distance", ["l2", "cosine"])
def test_distances_equal_the_definition_written_out(distance):
    rng = np.random.default_rng(1)
    features, labels = rng.standard_normal((60, 5)), rng.integers(0, 4, 60)
    expected = []
    for f, y in zip(features, labels):
        mean = features[labels == y].mean(axis=0)
        expected.append(np.linalg.norm(f - mean) if distance == "l2"
                        else 1 - f @ mean / (np.linalg.norm(f) * np.linalg.norm(mean)))
    np.testing.assert_allclose(class_mean_distances(features, labels, distance), expected, rtol=1e-12, atol=1e-12)
    parts = np.array_split(np.arange(60), 4)  # shard by shard: the same numbers
    means = combine_class_sums(class_sums(features[p], labels[p]) for p in parts)
    sharded = np.concatenate([distances_to_class_means(features[p], labels[p], means, distance) for p in parts])
    np.testing.assert_allclose(sharded, expected, rtol=1e-12, atol=1e-12)


def test_shards_of_different_widths_have_no_common_means_and_a_bad_distance_is_named():
    with pytest.raises(ValueError, match="different widths"):
        combine_class_sums([class_sums(np.ones((2, 3)), [0, 1]), class_sums(np.ones((2, 4)), [0, 1])])
    with pytest.raises(ValueError, match="distance must be 'l2' or 'cosine', got 'l1'"):
        class_mean_distances(np.ones((2, 3)), [0, 0], "l1")
