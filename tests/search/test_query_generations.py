"""The one rule for embeddings given per generation (``search.query_generations``), checked with
the two front ends' subjects: exactly the serving generation and the generations a slerp path
interpolates with, each as wide as that generation embeds."""
import numpy as np
import pytest

from orchestrator.search.query_generations import split_by_generation

WIDTHS = {"g1": 4, "g0": 3, "g7": 2}.__getitem__


def test_the_serving_generations_queries_and_the_interpolated_ones_are_split():
    new, old = np.ones((2, 4)), np.zeros((2, 3))
    queries, others = split_by_generation({"g0": old, "g1": new}, "g1", ("g0",), WIDTHS, "x")
    assert queries is new and list(others) == ["g0"] and others["g0"] is old
    assert split_by_generation({"g1": new}, "g1", (), WIDTHS, "x") == (new, {})


@pytest.mark.parametrize("keyed, message", [
    ({"g1": np.ones((1, 4))}, "query file q.npz has no entry for generation(s) ['g0']; this search takes ['g1', 'g0']"),
    ({"g1": np.ones((1, 4)), "g0": np.ones((1, 3)), "g7": np.ones((1, 2))},
     "query file q.npz has entries for generation(s) ['g7'] this search does not use; it takes ['g1', 'g0']"),
    ({"g1": np.ones((1, 4)), "g0": np.ones((1, 5))},
     "query file q.npz has 5 values per query for generation 'g0', which embeds 3"),
])
def test_a_missing_unused_or_wrong_width_generation_is_one_line_naming_it(keyed, message):
    with pytest.raises(ValueError) as refused:
        split_by_generation(keyed, "g1", ("g0",), WIDTHS, "query file q.npz")
    assert str(refused.value) == message
