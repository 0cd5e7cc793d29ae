"""How the lineage records and shows a health stop (issue 38, item 1): the train step failed with
the check's one line, the generation failed, and a sweep trial the check stopped as collapsed."""
from __future__ import annotations

from orchestrator.lineage import LineageStore, lineage_json, lineage_tree_text

LINE = "g1: own CMC@1 0.017 after 4 epochs, chance is 0.016 (it stops below 0.039 ...)"


def test_a_stopped_train_step_shows_its_line_and_its_generation_failed(tmp_path):
    store = LineageStore(tmp_path / "lineage.db")
    store.upsert_generation("g0", method="hbct")
    store.mark_generation_trained("g0", "file:///ckpt/g0", "a" * 64, {"loss": 0.1, "health/own_cmc@1": 0.9},
                                  step="train:g0", step_outputs={"health": {"own_cmc@1": 0.9, "chance": 0.1}})
    store.upsert_generation("g1", parent="g0", method="hbct", status="training")
    store.start_step("train:g1")
    store.fail_step("train:g1", f"stopped by the health check: {LINE}")
    store.set_generation_status("g1", "failed")

    text = lineage_tree_text(store)
    assert f"failed    train:g1 (attempt 1): stopped by the health check: {LINE}" in text
    assert any(line.split()[:3] == ["└─", "g1", "hbct"] and "failed" in line for line in text.splitlines())
    document = lineage_json(store)
    steps = {s["key"]: s for s in document["steps"]}
    assert steps["train:g1"]["error"] == f"stopped by the health check: {LINE}"
    assert steps["train:g0"]["outputs"]["health"] == {"own_cmc@1": 0.9, "chance": 0.1}


def test_a_collapsed_sweep_trial_shows_as_collapsed(tmp_path):
    store = LineageStore(tmp_path / "lineage.db")
    store.upsert_generation("g0", method="hbct")
    store.record_candidate("sweep/t1", sweep="sweep", trial_id="t1", parent="g0", method="hbct", params={},
                           outcome="stopped", epochs=2, metrics={"health/stop": LINE})
    store.record_candidate("sweep/t2", sweep="sweep", trial_id="t2", parent="g0", method="hbct", params={},
                           outcome="stopped", epochs=1, metrics={})
    text = lineage_tree_text(store)
    assert "candidate collapsed @2 ep" in text and "candidate stopped @1 ep" in text
