"""Update scenarios (hbct.md §10) and class-incremental splits (hbct.md §14, stationary_dsimplex.md §6.2)."""
from __future__ import annotations

import numpy as np
import pytest

from orchestrator.data import (
    Scenario,
    class_increment_splits,
    cumulative_classes,
    extended_class,
    extended_data,
    first_classes,
    first_per_class,
    scenario_indices,
    select_classes,
    stratified_sample,
)


def cifar_like_labels(num_classes: int = 100, per_class: int = 5, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), per_class))


def test_extended_class_keeps_the_first_half_of_cifar100_classes():
    labels = cifar_like_labels()
    old, new = extended_class(labels)
    assert set(labels[old]) == set(range(50))
    assert old.size == 250 and np.all(np.diff(old) > 0)
    np.testing.assert_array_equal(old, [i for i, y in enumerate(labels) if y < 50])
    np.testing.assert_array_equal(new, np.arange(500))


@pytest.mark.parametrize(("fraction", "count"), [(0.3, 3), (0.25, 3), (0.5, 5), (1.0, 10), (0.01, 1)])
def test_first_classes_is_the_ceiling_of_the_fraction(fraction, count):
    labels = np.array([9, 3, 7, 0, 1, 2, 4, 5, 6, 8, 3, 9])
    np.testing.assert_array_equal(first_classes(labels, fraction), np.arange(count))


def test_first_classes_counts_present_classes_only():
    labels = np.array([10, 30, 20, 40, 30])  # 4 classes present
    np.testing.assert_array_equal(first_classes(labels, 0.5), [10, 20])


def test_extended_data_stratified_takes_thirty_percent_of_every_class():
    labels = np.concatenate([np.full(n, c) for c, n in enumerate([50, 37, 61, 12])])
    old, new = extended_data(labels, 0.3, seed=4)
    assert old.size == round(0.3 * labels.size) and np.unique(old).size == old.size
    counts = np.bincount(labels[old], minlength=4)
    assert np.all(np.abs(counts - 0.3 * np.bincount(labels)) < 1)
    np.testing.assert_array_equal(new, np.arange(labels.size))
    np.testing.assert_array_equal(old, extended_data(labels, 0.3, seed=4)[0])
    assert not np.array_equal(old, extended_data(labels, 0.3, seed=5)[0])


def test_extended_data_uniform_draw():
    labels = cifar_like_labels()
    old, _ = extended_data(labels, 0.3, seed=0, stratified=False)
    assert old.size == 150 and np.unique(old).size == 150 and old.max() < 500


def test_stratified_sample_apportions_by_largest_remainder():
    labels = np.repeat([0, 1, 2], [10, 5, 3])  # 0.5 * counts = 5, 2.5, 1.5; total 9
    picked = stratified_sample(labels, 0.5, seed=0)
    np.testing.assert_array_equal(np.bincount(labels[picked]), [5, 3, 1])  # tie goes to the lower class


def test_first_per_class_keeps_dataset_order():
    labels = np.array([1, 0, 1, 1, 2, 0, 1, 0, 0])
    np.testing.assert_array_equal(first_per_class(labels, 2), [0, 1, 2, 4, 5])
    expected = sorted(i for c in (0, 1, 2) for i in [j for j, y in enumerate(labels) if y == c][:3])
    np.testing.assert_array_equal(first_per_class(labels, 3), expected)


def test_seven_task_split_of_the_dsimplex_paper():
    splits = class_increment_splits(100, 10, 15)
    assert [len(s) for s in splits] == [10] + [15] * 6
    assert sum(splits, []) == list(range(100))
    assert cumulative_classes(splits, 2) == list(range(40))
    assert cumulative_classes(splits, 6) == list(range(100))


def test_thirty_one_task_split_and_hbct_five_stages():
    long = class_increment_splits(100, 10, 3)
    assert len(long) == 31 and [len(s) for s in long[1:]] == [3] * 30 and long[-1] == [97, 98, 99]
    stages = class_increment_splits(100, 20, 20)
    assert [len(cumulative_classes(stages, t)) for t in range(5)] == [20, 40, 60, 80, 100]


def test_splits_that_do_not_cover_the_classes_are_rejected():
    with pytest.raises(ValueError, match=r"first=10 .* step=20 .* num_classes=100"):
        class_increment_splits(100, 10, 20)
    with pytest.raises(ValueError, match="num_classes=100"):
        class_increment_splits(100, 120, 10)
    with pytest.raises(ValueError, match="step"):
        class_increment_splits(100, 10, 0)
    with pytest.raises(ValueError, match="task"):
        cumulative_classes(class_increment_splits(100, 10, 15), 7)


def test_select_classes_matches_brute_force():
    labels = cifar_like_labels(num_classes=7, per_class=4, seed=2)
    np.testing.assert_array_equal(select_classes(labels, [6, 2]), [i for i, y in enumerate(labels) if y in (2, 6)])


def test_scenario_indices_for_all_four_scenarios():
    labels = cifar_like_labels(num_classes=10, per_class=10)
    everything = np.arange(100)
    old, new = scenario_indices("extended_class", labels)
    assert set(labels[old]) == set(range(5)) and np.array_equal(new, everything)
    old, new = scenario_indices(Scenario.EXTENDED_DATA, labels, old_data_fraction=0.3, seed=1)
    assert old.size == 30 and np.all(np.bincount(labels[old]) == 3) and np.array_equal(new, everything)
    old, new = scenario_indices("new_architecture", labels)
    assert np.array_equal(old, everything) and np.array_equal(new, everything)
    old, new = scenario_indices("both", labels, old_class_fraction=0.3)
    assert set(labels[old]) == {0, 1, 2} and np.array_equal(new, everything)
    assert Scenario("both").changes_architecture and Scenario.NEW_ARCHITECTURE.changes_architecture
    assert not Scenario.EXTENDED_CLASS.changes_architecture and not Scenario.EXTENDED_DATA.changes_architecture


def test_scenario_errors_name_the_argument():
    labels = cifar_like_labels(num_classes=4, per_class=2)
    with pytest.raises(ValueError, match="extended_class, extended_data, new_architecture, both"):
        scenario_indices("extended_task", labels)
    with pytest.raises(ValueError, match="old_data_fraction"):
        extended_data(labels, 0.0)
    with pytest.raises(ValueError, match="old_class_fraction"):
        extended_class(labels, 1.5)
    with pytest.raises(ValueError, match="fraction"):
        stratified_sample(labels, -0.1)
    with pytest.raises(ValueError, match="old_data_fraction"):
        extended_data(labels, 0.01)  # rounds to zero items
    with pytest.raises(ValueError, match="labels"):
        extended_class(labels.astype(float))
    with pytest.raises(ValueError, match="per_class"):
        first_per_class(labels, 0)
