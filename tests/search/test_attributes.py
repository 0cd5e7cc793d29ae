"""The hits' attributes from columnar arrays (``search.attributes.ItemColumns``) against a
row-by-row lookup of the same Arrow table."""
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from orchestrator.search import attributes
from orchestrator.search.attributes import ItemColumns


def shard(ids, attributes):
    return SimpleNamespace(ids=np.asarray(ids, dtype=np.int64), attributes=attributes)


def by_row(stored, ids):
    """The independent reference: each id's row of the table, as a dict ({} when absent)."""
    table = stored.attributes.to_pylist()
    rows = {int(i): row for i, row in zip(stored.ids, table)}
    return [rows.get(int(i), {}) for i in ids]


@pytest.mark.parametrize("conversion_rows", [8192, 7])  # one slice, or 43 slices of the 300 rows
def test_rows_and_subsets_equal_a_row_by_row_lookup(conversion_rows, monkeypatch):
    monkeypatch.setattr(attributes, "CONVERSION_ROWS", conversion_rows)
    rng = np.random.default_rng(0)
    ids = rng.permutation(1000)[:300] * 7  # unsorted, sparse
    table = pa.table({"uri": [f"s3://b/{i}.png" for i in ids], "label": (ids % 13).tolist(),
                      "note": [None if i % 5 else "five" for i in ids]})
    stored = shard(ids, table)
    columns = ItemColumns.of_attributes(stored.ids, stored.attributes)
    wanted = np.concatenate([rng.choice(ids, 40), [-1, 3, 10**9], ids[:5]])  # repeats, absent ids and −1
    assert columns.rows(wanted) == by_row(stored, wanted)
    part = columns.subset(wanted)  # what a shard share sends back: only those items
    assert len(part.ids) == len(set(wanted.tolist()) & set(ids.tolist()))
    assert part.rows(wanted) == by_row(stored, wanted)
    halves = ItemColumns.joined([columns.subset(wanted[:20]), columns.subset(wanted[10:])])
    assert halves.rows(wanted) == by_row(stored, wanted)


def test_a_shard_without_attributes_gives_empty_dicts():
    columns = ItemColumns.of_attributes(np.array([4, 2]), None)
    assert columns.rows(np.array([4, 2, 9])) == [{}, {}, {}]
    assert columns.subset(np.array([4])).rows(np.array([4])) == [{}]
    assert ItemColumns.joined([]).rows(np.array([1])) == [{}]
