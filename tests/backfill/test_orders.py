"""Backfill orders live in one registry (``backfill.orders``): a registered order is what pipeline
files accept and what the scoring computes; its checks (labels, finite values) are the registry's,
whichever order."""
from __future__ import annotations

import numpy as np
import pytest

from orchestrator.backfill.orders import ORDERS, BackfillOrder, OrderInputs, register_order, shard_priorities
from orchestrator.config import BackfillPolicy
from orchestrator.gallery import ShardEmbeddings


def shard(ids, labels=None) -> ShardEmbeddings:
    ids = np.asarray(ids, dtype=np.int64)
    labels = np.zeros(ids.size, np.int64) if labels is None else np.asarray(labels, dtype=np.int64)
    return ShardEmbeddings(ids, labels, np.ones((ids.size, 3), np.float32), np.zeros(ids.size, np.float32), "g0",
                           "lorentz", 1.0)


@pytest.fixture
def newest_first():
    @register_order
    class NewestFirst(BackfillOrder):
        name = "newest_first"
        needs_labels = True

        def priorities(self, shard, inputs, index):
            return shard.ids.astype(np.float64)

    yield NewestFirst
    ORDERS.pop("newest_first")


def test_a_registered_order_is_accepted_by_pipeline_files_and_scores_shards(newest_first):
    assert BackfillPolicy(policy="full", order="newest_first").order == "newest_first"
    scores = shard_priorities(shard([5, 9, 2]), "newest_first", OrderInputs("here"), 0)
    np.testing.assert_array_equal(scores, [5.0, 9.0, 2.0])
    with pytest.raises(ValueError, match="here: needs gallery labels; shard 3 has items without a label"):
        shard_priorities(shard([1, 2], labels=[0, -1]), "newest_first", OrderInputs("here"), 3)
    with pytest.raises(ValueError, match="is registered already"):
        register_order(newest_first)


def test_an_unknown_order_is_refused_by_name_and_priorities_must_be_finite():
    with pytest.raises(ValueError, match="order\n  Value error, must be one of uncertainty, random"):
        BackfillPolicy(policy="full", order="newest_first")
    nan = shard([1, 2])
    nan.uncertainty[:] = np.nan
    with pytest.raises(ValueError, match="x: shard 4 has non-finite priorities"):
        shard_priorities(nan, "uncertainty", OrderInputs("x"), 4)
