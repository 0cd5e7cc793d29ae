"""``damaged_state_files``: an interrupted sweep's Ray Tune state files, each whole or named."""
from __future__ import annotations

import json
import pickle

from orchestrator.tuning.saved_state import damaged_state_files


def write_state(folder, searcher: bytes, experiment: bytes) -> None:
    (folder / "tuner.pkl").write_bytes(pickle.dumps({"space": [1, 2, 3]}))
    (folder / "search_gen_state-2026-01-01_00-00-00.json").write_bytes(searcher)
    (folder / "experiment_state-2026-01-01_00-00-00.json").write_bytes(experiment)
    (folder / "trial_0").mkdir()
    (folder / "trial_0" / "result.json").write_bytes(b"{not json, and not a state file")


def test_whole_state_files_pass(tmp_path):
    write_state(tmp_path, pickle.dumps({"counter": 3, "finished": False}, protocol=5), json.dumps({"trial_data": []}).encode())
    assert damaged_state_files(str(tmp_path)) == []


def test_a_pickle_cut_short_an_empty_one_and_cut_json_are_named(tmp_path):
    whole = pickle.dumps({"counter": 3, "values": list(range(50))}, protocol=5)
    write_state(tmp_path, whole[: len(whole) // 2], b'{"trial_data": [')
    (tmp_path / "searcher-state-2026-01-01_00-00-00.pkl").write_bytes(b"")
    (tmp_path / "basic-variant-state-2026-01-01_00-00-00.json").write_bytes(whole + b"trailing")
    assert damaged_state_files(str(tmp_path)) == sorted(str(tmp_path / name) for name in (
        "basic-variant-state-2026-01-01_00-00-00.json", "experiment_state-2026-01-01_00-00-00.json",
        "search_gen_state-2026-01-01_00-00-00.json", "searcher-state-2026-01-01_00-00-00.pkl"))
