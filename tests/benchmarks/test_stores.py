"""benchmarks/stores.py on a tiny gallery: every store holds the same shards, an exact store finds
what the shard files find (recall 1.0), and each row carries the measured columns."""
from __future__ import annotations

import json

from benchmarks.stores import main


def test_every_store_is_measured_side_by_side(tmp_path, capsys):
    out = tmp_path / "stores.json"
    assert main(["--sizes", "3000", "--single", "5", "--batch", "5", "--shards", "3", "--json", str(out),
                 "--workdir", str(tmp_path), "--stores", "files/flat", "pgvector/exact", "pgvector/hnsw",
                 "lance/exact", "lance/ivf_pq"]) == 0
    rows = json.loads(out.read_text())
    assert [r["store"] for r in rows] == ["files/flat", "pgvector/exact", "pgvector/hnsw", "lance/exact", "lance/ivf_pq"]
    for row in rows:
        assert row["n"] == 3000 and row["backfill_items_per_s"] > 0 and row["single_qps"] > 0
        assert row["p99_ms"] >= row["p50_ms"] > 0 and row["disk_bytes"] > 0 and 0 <= row["recall_at_10"] <= 1
    exact = {r["store"]: r["recall_at_10"] for r in rows if r["store"].endswith(("exact", "flat"))}
    assert exact == {"files/flat": 1.0, "pgvector/exact": 1.0, "lance/exact": 1.0}
    assert "| 3,000 | pgvector/hnsw |" in capsys.readouterr().out
