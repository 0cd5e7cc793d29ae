"""The lineage store on a real PostgreSQL server: the URL forms users write, and the write protocol
(steps, idempotent rows, NaN as NULL in JSON, aware datetimes) as on SQLite."""
from __future__ import annotations

import math
from datetime import timezone

import pytest

from orchestrator.lineage import LineageStore
from orchestrator.lineage.store import normalise_url


@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "postgresql+psycopg"])
def test_every_postgresql_url_form_opens_with_psycopg_3(scheme, postgres_url):
    url = postgres_url.replace("postgresql+psycopg://", f"{scheme}://", 1)
    assert normalise_url(url).drivername == "postgresql+psycopg"
    store = LineageStore(url)
    store.upsert_generation("g0", method="independent", params={})
    assert store.get_generation("g0").status == "pending"
    store.close()


def test_the_write_protocol_on_postgresql(postgres_url):
    store = LineageStore(postgres_url)
    assert store.start_step("train:g0").attempts == 1
    store.upsert_generation("g0", method="independent", params={"lr": 0.1}, arch="test_resnet", space="cosine")
    store.mark_generation_trained("g0", "s3://b/g0", "a" * 64, {"loss": float("nan"), "epoch": 1},
                                  step="train:g0", step_outputs={"sha256": "a" * 64})
    assert store.start_step("train:g0").status == "committed"  # a re-run skips it
    store.upsert_generation("g1", parent="g0", method="bct", params={})
    rows = [("g1", "g0", "map", 0.5, "test"), ("g1", "g0", "cmc@1", math.nan, "test")]
    store.record_compatibility(rows)
    store.record_compatibility(rows)  # idempotent
    g0 = store.get_generation("g0")
    assert g0.metrics == {"loss": None, "epoch": 1} and g0.updated_at.tzinfo is not None
    assert g0.updated_at.utcoffset() == timezone.utc.utcoffset(None)
    values = {v.metric: v.value for v in store.compatibility_values()}
    assert values == {"map": 0.5, "cmc@1": None}
    counts = store.row_counts()
    assert (counts["generations"], counts["compatibility"], counts["steps"]) == (2, 2, 1)
    store.close()
