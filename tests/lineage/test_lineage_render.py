"""`orchestrator lineage` output: the generation tree with metrics, the shard table, the JSON."""
from __future__ import annotations

import json

import pytest

from orchestrator.lineage import LineageStore, lineage_json, lineage_tree_text
from orchestrator.lineage.step_keys import train_key


@pytest.fixture
def store(tmp_path):
    s = LineageStore(tmp_path / "lineage.db")
    s.upsert_generation("g0", method="independent", arch="resnet18", space="euclidean")
    s.upsert_generation("g1", parent="g0", method="bct", params={"lambda": 1.0})
    s.upsert_generation("g2", parent="g1", method="hbct", space="lorentz", curv=1.0)
    s.upsert_generation("g1b", parent="g0", method="l2")
    for name in ("g0", "g1", "g2"):
        s.mark_generation_trained(name, f"file:///ckpt/{name}", "a" * 64, {"loss": 0.1}, step=train_key(name))
    s.record_compatibility([
        ("g0", "g0", "cmc@1", 0.70, "digits"), ("g0", "g0", "map", 0.50, "digits"),
        ("g1", "g1", "cmc@1", 0.80, "digits"), ("g1", "g1", "map", 0.60, "digits"),
        ("g1", "g0", "cmc@1", 0.75, "digits"), ("g1", "g0", "map", 0.55, "digits"),
        ("g2", "g2", "cmc@1", 0.90, "digits"), ("g2", "g1", "cmc@1", 0.85, "digits"),
        ("g2", "g0", "cmc@1", 0.01, "digits"),  # not its parent: not a key metric of g2
        ("g1b", "g0", "cmc@1", float("nan"), "digits"),
    ])
    s.upsert_gallery("digits-gallery", "pkg://digits", 90, 3)
    for i in range(3):
        s.assign_shard("digits-gallery", i, "g0", f"e/{i}", f"i/{i}", f"{i}" * 64, 30)
    s.assign_shard("digits-gallery", 1, "g2", "e/1-g2", "i/1-g2", "f" * 64, 30)
    s.deploy("g2")
    s.start_step("train:g1b")
    return s


def test_tree_text_shows_indentation_methods_status_and_key_metrics(store):
    text = lineage_tree_text(store)
    lines = text.splitlines()
    gen_lines = lines[1:5]
    assert [line.split()[0] for line in gen_lines] == ["g0", "├─", "│", "└─"]
    g0, g1, g2, g1b = gen_lines
    assert g0.startswith("g0 ") and g1.startswith("├─ g1 ") and g2.startswith("│  └─ g2 ") and g1b.startswith("└─ g1b ")
    assert "independent" in g0 and "self CMC@1 0.700 mAP 0.500" in g0
    assert "bct" in g1 and "trained" in g1
    assert "self CMC@1 0.800 mAP 0.600 | cross→g0 CMC@1 0.750 mAP 0.550" in g1
    assert "hbct" in g2 and "self CMC@1 0.900 | cross→g1 CMC@1 0.850" in g2 and "0.010" not in g2
    assert g2.rstrip().endswith("[serving]") and "[serving]" not in g0
    assert "l2" in g1b and "pending" in g1b and "cross→g0 CMC@1 n/a" in g1b
    # columns line up: method starts at the same offset on every generation line
    assert len({line.index(m) for line, m in zip(gen_lines, ["independent", "bct", "hbct", "l2"])}) == 1

    shard_part = text[text.index("Gallery shards"):]
    rows = [line.split() for line in shard_part.splitlines()[3:6]]
    assert rows == [["digits-gallery", "0", "30", "g0", "0" * 12], ["digits-gallery", "1", "30", "g2", "f" * 12],
                    ["digits-gallery", "2", "30", "g0", "2" * 12]]
    assert "Steps: 3 committed, 1 started, 0 failed" in text
    assert "started   train:g1b (attempt 1)" in text


def test_tree_text_of_an_empty_store(tmp_path):
    text = lineage_tree_text(LineageStore(tmp_path / "empty.db"))
    assert text == "Generations\n  (none)\n\nGallery shards\n  (none)\n"


def test_tree_text_with_several_datasets_labels_each(store):
    store.record_compatibility([("g1", "g1", "cmc@1", 0.4, "cifar")])
    g1 = next(line for line in lineage_tree_text(store).splitlines() if "─ g1 " in line)
    assert "cifar: self CMC@1 0.400" in g1 and "digits: self CMC@1 0.800" in g1
    g1_digits = next(line for line in lineage_tree_text(store, dataset="digits").splitlines() if "─ g1 " in line)
    assert "cifar" not in g1_digits and "self CMC@1 0.800" in g1_digits


def test_json_round_trips_and_holds_everything(store):
    doc = lineage_json(store)
    again = json.loads(json.dumps(doc, allow_nan=False))
    assert again == doc
    assert [g["name"] for g in doc["generations"]] == ["g0", "g1", "g2", "g1b"]
    assert doc["generations"][2]["parent"] == "g1" and doc["generations"][2]["curv"] == 1.0
    assert isinstance(doc["generations"][0]["created_at"], str) and doc["generations"][0]["created_at"].endswith("+00:00")
    assert {"query": "g1b", "gallery": "g0", "metric": "cmc@1", "value": None, "dataset": "digits"} in doc["compatibility"]
    (gallery,) = doc["galleries"]
    assert [s["generation"] for s in gallery["shards"]] == ["g0", "g2", "g0"]
    assert [(b["shard_index"], b["from_generation"], b["to_generation"]) for b in doc["backfills"]][-1] == (1, "g0", "g2")
    assert doc["current_deployment"]["generation"] == "g2"
    assert {s["key"]: s["status"] for s in doc["steps"]}["train:g1b"] == "started"
    assert doc["url"].startswith("sqlite:///")
