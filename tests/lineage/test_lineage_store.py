"""LineageStore API: idempotency, unique constraints, step lifecycle, shards and backfills."""
from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy.exc import IntegrityError

from orchestrator.lineage import LineageStore
from orchestrator.lineage.schema import Compatibility, Gallery, Generation, Shard, Step


@pytest.fixture
def store(tmp_path):
    s = LineageStore(f"sqlite:///{tmp_path}/lineage.db")
    yield s
    s.close()


def pipeline_calls(store: LineageStore) -> list:
    """What a small pipeline records, as (step key, call) pairs, in order."""
    return [
        ("run", lambda: store.register_run("lifelong", "c" * 64)),
        ("train:g0", lambda: store.start_step("train:g0")),
        ("train:g0", lambda: store.upsert_generation("g0", method="independent", params={"lr": 0.1},
                                                     arch="resnet18", space="euclidean")),
        ("train:g0", lambda: store.mark_generation_trained("g0", "file:///ckpt/g0", "a" * 64, {"loss": 0.5},
                                                           step="train:g0")),
        ("train:g1", lambda: store.upsert_generation("g1", parent="g0", method="bct", params={"lambda": 1.0})),
        ("train:g1", lambda: store.mark_generation_trained("g1", "file:///ckpt/g1", "b" * 64, {"loss": 0.4})),
        ("train:g1", lambda: store.commit_step("train:g1", {"checkpoint": "file:///ckpt/g1"})),
        ("evaluate:g1", lambda: store.record_compatibility([
            ("g0", "g0", "cmc@1", 0.8, "digits"), ("g1", "g1", "cmc@1", 0.85, "digits"),
            ("g1", "g0", "cmc@1", 0.82, "digits"), ("g1", "g0", "map", float("nan"), "digits"),
        ], step="evaluate:g1")),
        ("index:g0", lambda: store.upsert_gallery("gal", "pkg://digits", 100, 2)),
        ("index:g0", lambda: store.assign_shard("gal", 0, "g0", "e/0", "i/0", "d" * 64, 50)),
        ("index:g0", lambda: store.assign_shard("gal", 1, "g0", "e/1", "i/1", "e" * 64, 50, step="index:g0")),
        ("backfill:gal:0:g1", lambda: store.assign_shard("gal", 0, "g1", "e/0-g1", "i/0-g1", "f" * 64, 50,
                                                         step="backfill:gal:0:g1")),
        ("deploy:g1", lambda: store.deploy("g1", step="deploy:g1")),
    ]


def snapshot(store: LineageStore, ignore: tuple[str, ...] = ()):
    strip = lambda records: [  # noqa: E731
        {k: v for k, v in dataclasses.asdict(r).items() if not k.endswith("_at") and k not in ("id", *ignore)}
        for r in records]
    return (strip(store.list_generations()), strip(store.compatibility_values()), strip(store.shards("gal")),
            strip(store.backfills()), strip(store.deployments()), strip(store.steps()))


EXPECTED_COUNTS = {"pipeline_runs": 1, "generations": 2, "steps": 6, "compatibility": 4, "galleries": 1,
                   "shards": 2, "backfills": 3, "deployments": 1, "candidates": 0, "run_locks": 0, "settings": 0}


def test_every_call_twice_leaves_the_same_rows_as_once(tmp_path):
    once, twice = LineageStore(tmp_path / "once.db"), LineageStore(tmp_path / "twice.db")
    for _, call in pipeline_calls(once):
        call()
    for _, call in pipeline_calls(twice):
        call()
        call()
    assert once.row_counts() == EXPECTED_COUNTS
    assert twice.row_counts() == EXPECTED_COUNTS
    # by design, two counters count calls: invocations of the pipeline, and attempts of a step
    # started twice (the second start is what a restart after a crash looks like)
    assert (once.runs()[0].invocations, twice.runs()[0].invocations) == (1, 2)
    assert (once.get_step("train:g0").attempts, twice.get_step("train:g0").attempts) == (1, 2)
    assert snapshot(once, ignore=("attempts",)) == snapshot(twice, ignore=("attempts",))


def test_rerunning_the_pipeline_skips_committed_steps_without_duplicates(store):
    for _, call in pipeline_calls(store):
        call()
    before, updated = snapshot(store), [g.updated_at for g in store.list_generations()]
    for key, call in pipeline_calls(store):  # the same command again, as a resuming driver runs it
        if key == "run" or store.step_status(key) != "committed":
            call()
    assert store.row_counts() == EXPECTED_COUNTS
    assert snapshot(store) == before
    assert [g.updated_at for g in store.list_generations()] == updated  # unchanged rows are not touched


def test_unique_constraints_reject_duplicates_written_directly(store):
    store.upsert_generation("g0")
    store.upsert_gallery("gal", n_shards=1)
    g0 = store.get_generation("g0").id
    duplicates = [
        lambda s: s.add(Generation(name="g0", params={}, metrics={})),
        lambda s: s.add(Gallery(name="gal", n_shards=3)),
        lambda s: s.add(Shard(gallery_id=1, index=0)),
        lambda s: s.add(Step(key="k", outputs={})) or s.add(Step(key="k", outputs={})),
        lambda s: s.add_all([Compatibility(query_generation_id=g0, gallery_generation_id=g0, metric="map",
                                           value=v, dataset="d") for v in (0.1, 0.2)]),
    ]
    for add in duplicates:
        with pytest.raises(IntegrityError):
            with store.transaction() as session:
                add(session)
                session.flush()
    assert store.row_counts()["generations"] == 1 and store.row_counts()["steps"] == 0


def test_foreign_keys_are_enforced_on_sqlite(store):
    with pytest.raises(IntegrityError):
        with store.transaction() as session:
            session.add(Generation(name="orphan", parent_id=999, params={}, metrics={}))
            session.flush()


def test_step_lifecycle_and_restart_after_a_crash(store):
    assert store.step_status("train:g1") is None
    first = store.start_step("train:g1")
    assert (first.status, first.attempts) == ("started", 1)
    # the driver dies here; the same command runs again
    second = store.start_step("train:g1")
    assert (second.status, second.attempts) == ("started", 2)
    assert store.committed_outputs("train:g1") is None
    done = store.commit_step("train:g1", {"checkpoint": "s3://b/g1.safetensors"})
    assert (done.status, done.attempts, done.finished_at is not None) == ("committed", 2, True)
    assert store.committed_outputs("train:g1") == {"checkpoint": "s3://b/g1.safetensors"}
    # a third run sees it committed and does not restart it
    third = store.start_step("train:g1")
    assert (third.status, third.attempts, third.outputs) == ("committed", 2, done.outputs)
    assert store.row_counts()["steps"] == 1
    # an explicit rerun restarts it
    assert store.start_step("train:g1", rerun=True).attempts == 3


def test_failed_step_records_the_error_and_restarts(store):
    store.start_step("evaluate:g1")
    try:
        raise RuntimeError("CUDA out of memory")
    except RuntimeError as exc:
        failed = store.fail_step("evaluate:g1", exc)
    assert failed.status == "failed" and "CUDA out of memory" in failed.error and "Traceback" in failed.error
    again = store.start_step("evaluate:g1")
    assert (again.status, again.attempts, again.error) == ("started", 2, None)
    store.commit_step("evaluate:g1", {})
    with pytest.raises(ValueError, match="already committed"):
        store.fail_step("evaluate:g1", "late error")


def test_run_step_skips_committed_steps(store):
    calls = []
    assert store.run_step("index:gal:0", lambda: calls.append(1) or {"n": 1}) == {"n": 1}
    assert store.run_step("index:gal:0", lambda: calls.append(1) or {"n": 2}) == {"n": 1}
    assert calls == [1]
    with pytest.raises(ZeroDivisionError):
        store.run_step("broken", lambda: 1 / 0)
    assert store.step_status("broken") == "failed"


def test_outputs_and_params_are_json_cleaned(store):
    import numpy as np
    store.upsert_generation("g0", params={"lam": np.float32(0.5), "dims": (4, 8), "bad": float("inf")})
    assert store.get_generation("g0").params == {"lam": 0.5, "dims": [4, 8], "bad": None}
    store.commit_step("s", {"ids": np.arange(3)})
    assert store.committed_outputs("s") == {"ids": [0, 1, 2]}


def test_generations_parents_first_and_lookup_errors(store):
    store.upsert_generation("g0", method="independent")
    store.upsert_generation("g1", parent="g0", method="bct")
    store.upsert_generation("h0")
    store.upsert_generation("g2", parent="g1", method="hbct", curv=1.0, space="lorentz")
    store.upsert_generation("g1b", parent="g0", method="l2")
    order = [g.name for g in store.list_generations()]
    assert order == ["g0", "g1", "g2", "g1b", "h0"]
    assert store.get_generation("g2").parent == "g1" and store.get_generation("g2").curv == 1.0
    with pytest.raises(LookupError, match="g9"):
        store.get_generation("g9")
    with pytest.raises(LookupError, match="nope"):
        store.upsert_generation("g3", parent="nope")
    with pytest.raises(LookupError, match="x1, x2"):
        store.record_compatibility([("x1", "x2", "cmc@1", 0.1, "d")])
    with pytest.raises(LookupError, match="missing"):
        store.mark_generation_trained("missing", "file:///c")
    with pytest.raises(ValueError, match="cycle"):
        store.upsert_generation("g0", parent="g2")
    assert store.row_counts()["generations"] == 5


def test_upsert_updates_pending_but_freezes_trained_generations(store):
    store.upsert_generation("g0", method="bct", params={"lambda": 1.0})
    g = store.upsert_generation("g0", params={"lambda": 2.0})  # None fields keep their value
    assert (g.method, g.params, g.status) == ("bct", {"lambda": 2.0}, "pending")
    store.set_generation_status("g0", "training")
    store.mark_generation_trained("g0", "file:///c", "a" * 64, {"loss": 1.0})
    store.mark_generation_trained("g0", "file:///c", "a" * 64, {"acc": 0.9})
    g = store.get_generation("g0")
    assert g.status == "trained" and g.metrics == {"loss": 1.0, "acc": 0.9}
    # re-running the pipeline re-declares the generation: no status reset, no error
    assert store.upsert_generation("g0", method="bct", params={"lambda": 2.0}).status == "trained"
    with pytest.raises(ValueError, match="params"):
        store.upsert_generation("g0", params={"lambda": 3.0})
    with pytest.raises(ValueError, match="status"):
        store.upsert_generation("g1", status="done")


def test_record_compatibility_is_an_upsert(store):
    store.upsert_generation("g0")
    store.upsert_generation("g1", parent="g0")
    store.record_compatibility([("g1", "g0", "cmc@1", 0.5, "a"), ("g1", "g0", "cmc@1", 0.6, "b")])
    store.record_compatibility([{"query": "g1", "gallery": "g0", "metric": "cmc@1", "value": 0.7, "dataset": "a"},
                                ("g0", "g0", "map", float("nan"), "a")])
    values = {(c.query, c.gallery, c.metric, c.dataset): c.value for c in store.compatibility_values()}
    assert values == {("g1", "g0", "cmc@1", "a"): 0.7, ("g1", "g0", "cmc@1", "b"): 0.6, ("g0", "g0", "map", "a"): None}
    assert [c.value for c in store.compatibility_values("b")] == [0.6]


def test_assign_shard_moves_between_generations_and_records_backfills(store):
    for name, parent in (("g0", None), ("g1", "g0"), ("g2", "g1")):
        store.upsert_generation(name, parent=parent, status="trained")
    store.upsert_gallery("gal", "file:///data", 30, 3)
    assert [s.generation for s in store.shards("gal")] == [None, None, None]
    for i in range(3):
        store.assign_shard("gal", i, "g0", f"e/g0/{i}", f"i/g0/{i}", "0" * 64, 10)
    opened = store.start_backfill("gal", 1, "g1", items=10)
    assert opened.status == "started" and store.start_backfill("gal", 1, "g1").id == opened.id
    moved = store.assign_shard("gal", 1, "g1", "e/g1/1", "i/g1/1", "1" * 64, 10)
    assert (moved.generation, moved.embeddings_uri) == ("g1", "e/g1/1")
    store.assign_shard("gal", 1, "g1", "e/g1/1", "i/g1/1", "1" * 64, 10)  # the re-run: nothing new
    store.assign_shard("gal", 1, "g2", "e/g2/1", "i/g2/1", "2" * 64, 10)
    assert store.start_backfill("gal", 1, "g2") is None  # already there
    store.start_backfill("gal", 2, "g2")
    store.fail_backfill("gal", 2, "g2")
    assert [s.generation for s in store.shards("gal")] == ["g0", "g2", "g0"]
    history = [(b.shard_index, b.from_generation, b.to_generation, b.status) for b in store.backfills("gal")]
    assert history == [(0, None, "g0", "committed"), (1, None, "g0", "committed"), (2, None, "g0", "committed"),
                       (1, "g0", "g1", "committed"), (1, "g1", "g2", "committed"), (2, "g0", "g2", "failed")]
    assert store.backfills()[3].id == opened.id and store.backfills()[3].finished_at is not None
    with pytest.raises(ValueError, match="shards 0..2"):
        store.assign_shard("gal", 3, "g1", "e", "i")
    with pytest.raises(LookupError, match="other"):
        store.shards("other")
    with pytest.raises(LookupError, match="g7"):
        store.assign_shard("gal", 0, "g7", "e", "i")
    with pytest.raises(ValueError, match="shrink"):
        store.upsert_gallery("gal", "file:///data", 30, 2)


def test_deployments(store):
    assert store.current_deployment() is None
    store.upsert_generation("g0", status="trained")
    store.upsert_generation("g1", parent="g0")
    with pytest.raises(ValueError, match="pending"):
        store.deploy("g1")
    store.deploy("g0")
    store.mark_generation_trained("g1", "file:///c")
    first = store.deploy("g1")
    assert store.deploy("g1") == first
    assert store.current_deployment().generation == "g1"
    assert [d.generation for d in store.deployments()] == ["g0", "g1"]
    assert first.started_at.tzinfo is not None


def test_records_are_frozen_snapshots(store):
    g = store.upsert_generation("g0", params={"a": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.name = "x"  # type: ignore[misc]
    g.params["a"] = 2  # a copy: the store is untouched
    assert store.get_generation("g0").params == {"a": 1}


def test_plain_path_and_in_memory_urls(tmp_path):
    path = tmp_path / "deep" / "er" / "lineage.db"
    with LineageStore(path) as s:
        s.upsert_generation("g0")
    assert path.exists()
    assert LineageStore.under(tmp_path / "deep" / "er").get_generation("g0").name == "g0"
    memory = LineageStore("sqlite://")
    memory.upsert_generation("g0")
    assert [g.name for g in memory.list_generations()] == ["g0"]
    assert memory.row_counts()["generations"] == 1


def test_assign_shards_moves_items_into_a_new_shard_in_one_transaction(store):
    from orchestrator.lineage.records import ShardAssignment

    for name, parent in (("g0", None), ("g1", "g0")):
        store.upsert_generation(name, parent=parent, status="trained")
    store.upsert_gallery("gal", None, 20, 2)
    for i in range(2):
        store.assign_shard("gal", i, "g0", f"e/g0/{i}", None, "0" * 64, 10)
    store.start_step("split:gal/0:g1")
    split = [ShardAssignment(0, "g0", "e/g0/0-minus", None, "a" * 64, 6),
             ShardAssignment(2, "g1", "e/g1/2", None, "b" * 64, 4, backfilled_from="g0")]
    with pytest.raises(ValueError, match="shards 0..1, not 2"):
        store.assign_shards("gal", split)  # without grow, an unknown shard is an error ...
    assert store.get_gallery("gal").n_shards == 2 and store.shards("gal")[0].n_items == 10  # ... and nothing moved
    records = store.assign_shards("gal", split, grow=True, step="split:gal/0:g1")
    assert [(r.index, r.generation, r.n_items) for r in records] == [(0, "g0", 6), (2, "g1", 4)]
    assert store.get_gallery("gal").n_shards == 3
    assert [(s.generation, s.n_items) for s in store.shards("gal")] == [("g0", 6), ("g0", 10), ("g1", 4)]
    assert [(b.shard_index, b.from_generation, b.to_generation, b.items) for b in store.backfills("gal")][-1] == (2, "g0", "g1", 4)
    assert store.step_status("split:gal/0:g1") == "committed"
    with pytest.raises(ValueError, match="twice"):
        store.assign_shards("gal", [split[0], split[0]])


def test_the_index_records_commit_in_the_shards_transaction_or_not_at_all(store):
    from orchestrator.integrity import index_record, index_steps, recorded_index
    from orchestrator.lineage.records import ShardAssignment

    store.upsert_generation("g0", status="trained")
    store.upsert_gallery("gal", None, 20, 2)
    records = [index_record(b"index bytes %d" % i, list(range(10 * i, 10 * i + 10))) for i in range(3)]
    steps = index_steps((f"e/g0/{i}.index", records[i]) for i in range(3))
    assert set(steps) == {f"integrity:e/g0/{i}.index" for i in range(3)}
    with pytest.raises(ValueError, match="shards 0..1, not 2"):  # a refused assignment records no index either
        store.assign_shards("gal", [ShardAssignment(2, "g0", "e/g0/2", "e/g0/2.index", "0" * 64, 10)],
                            step="embed:gal/2:g0", with_steps={k: v for k, v in steps.items() if "/2." in k})
    assert recorded_index(store, "e/g0/2.index") is None and store.step_status("embed:gal/2:g0") is None
    store.assign_shard("gal", 0, "g0", "e/g0/0", "e/g0/0.index", "0" * 64, 10, step="embed:gal/0:g0",
                       with_steps={k: v for k, v in steps.items() if "/0." in k})
    assert recorded_index(store, "e/g0/0.index") == records[0] and store.step_status("embed:gal/0:g0") == "committed"
    assert recorded_index(store, "e/g0/1.index") is None  # only the steps given
