"""benchmarks/stores.py on a tiny gallery: every store holds the same shards, an exact store finds
what the shard files find (recall 1.0), each row carries the measured columns, and the stored rows
regenerate the README section between its markers."""
from __future__ import annotations

import json

from benchmarks.stores import BEGIN, END, main


def test_every_store_is_measured_side_by_side(tmp_path, capsys):
    out, stored = tmp_path / "stores.json", tmp_path / "stores.jsonl"
    assert main(["--sizes", "3000", "--single", "5", "--batch", "5", "--shards", "3", "--json", str(out),
                 "--rows-out", str(stored), "--note", "a test",
                 "--workdir", str(tmp_path), "--stores", "files/flat", "pgvector/exact", "pgvector/hnsw",
                 "lance/exact", "lance/ivf_pq"]) == 0
    rows = json.loads(out.read_text())
    assert [r["store"] for r in rows] == ["files/flat", "pgvector/exact", "pgvector/hnsw", "lance/exact", "lance/ivf_pq"]
    for row in rows:
        assert row["n"] == 3000 and row["backfill_items_per_s"] > 0 and row["single_qps"] > 0
        assert row["p99_ms"] >= row["p50_ms"] > 0 and row["disk_bytes"] > 0 and 0 <= row["recall_at_10"] <= 1
    exact = {r["store"]: r["recall_at_10"] for r in rows if r["store"].endswith(("exact", "flat"))}
    assert exact == {"files/flat": 1.0, "pgvector/exact": 1.0, "lance/exact": 1.0}
    printed = capsys.readouterr().out
    assert "| 3,000 | pgvector/hnsw |" in printed
    records = [json.loads(line) for line in stored.read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k not in ("commit", "date", "note")} for r in records] == rows
    assert {r["note"] for r in records} == {"a test"}

    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{BEGIN}\nstale\n{END}\nafter\n")
    assert main(["--from-rows", str(stored), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith(f"before\n{BEGIN}\n") and text.endswith(f"{END}\nafter\n") and "stale" not in text
    table_lines = [line for line in printed.splitlines() if line.startswith("|")]
    assert "\n".join(table_lines) in text  # the stored rows' table is the one the run printed
