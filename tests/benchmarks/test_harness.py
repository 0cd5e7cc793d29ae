"""The benchmarks' shared command-line reading (benchmarks/harness.py)."""
import argparse

import pytest

from benchmarks.harness import parse_sizes


def test_sizes_parse_from_scientific_notation_ascending_and_once_each():
    assert parse_sizes("1e5,1e6, 2000") == [2000, 100_000, 1_000_000]
    assert parse_sizes("1e3,1000,5e2,") == [500, 1000]


@pytest.mark.parametrize("bad", ["", " , ", "1e5,x", "0", "1e5,-3"])
def test_anything_but_positive_counts_is_refused_with_the_text(bad):
    with pytest.raises(argparse.ArgumentTypeError, match=f"positive item counts .*got {bad!r}"):
        parse_sizes(bad)
