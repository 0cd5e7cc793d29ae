"""One shard update from plan to commit: the plan file's entry, its step key, the run's fields."""
import json

import pytest

from orchestrator.pipeline.gallery.plan import GalleryPlan, ShardBefore
from orchestrator.shard_update import ShardUpdate, UpdateKind

# entries as plan files written before ShardUpdate held them (dataclasses.asdict of the old PlanEntry)
STORED_ENTRIES = [
    {"kind": "embed", "shard": 0, "num_items": 120, "rows": [0, 120], "selection": None, "target": None},
    {"kind": "embed", "shard": 1, "num_items": 80, "rows": None, "selection": None, "target": None},
    {"kind": "split", "shard": 2, "num_items": 17, "rows": None,
     "selection": ["/s/galleries/g/plans/g1.selection/shard-00002.parquet", "ab" * 32], "target": 3},
]


def test_a_plan_file_reads_back_into_updates_and_writes_the_same_json():
    stored = {"gallery": "g", "generation": "g1", "policy": {"policy": "partial"}, "entries": STORED_ENTRIES,
              "before": [{"shard": k, "generation": "g0", "embeddings_uri": f"/s/{k}.parquet", "sha256": str(k),
                          "n_items": 10} for k in range(3)], "order": [5, 4]}
    plan = GalleryPlan.from_json(json.loads(json.dumps(stored)))
    assert [e.kind for e in plan.entries] == [UpdateKind.EMBED, UpdateKind.EMBED, UpdateKind.SPLIT]
    assert plan.entries[0].rows == (0, 120) and plan.entries[2].selection == tuple(STORED_ENTRIES[2]["selection"])
    assert plan.before[1] == ShardBefore(1, "g0", "/s/1.parquet", "1", 10)
    assert plan.num_items == 120 + 80 + 17
    assert [e.target for e in plan.entries] == [None, None, 3]
    assert json.dumps(plan.to_json()) == json.dumps(stored)


def test_a_started_update_keeps_the_plan_and_adds_the_run():
    planned = ShardUpdate.from_planned_json(STORED_ENTRIES[2])
    assert (planned.key, planned.first_attempt, planned.source) == ("", True, None)
    key = planned.step_key("g", "g1")
    assert key == "split:g/2:g1"
    run = planned.started(key, False, ("/s/2.parquet", "2"))
    assert (run.key, run.first_attempt, run.source) == ("split:g/2:g1", False, ("/s/2.parquet", "2"))
    assert run.planned_json() == planned.planned_json() == STORED_ENTRIES[2]


def test_an_entry_of_no_known_kind_is_refused():
    with pytest.raises(ValueError, match="'merge' is not a valid UpdateKind"):
        ShardUpdate.from_planned_json({**STORED_ENTRIES[0], "kind": "merge"})
