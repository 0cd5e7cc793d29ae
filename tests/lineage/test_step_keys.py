"""The step keys: each constructor writes the string existing lineages hold, and the parser reads
every kind back into the fields it was built from."""
import pytest

from orchestrator.lineage.step_keys import (
    StepKey,
    StepKind,
    deploy_key,
    evaluate_key,
    gallery_eval_key,
    gate_key,
    integrity_key,
    integrity_location,
    kind_of,
    map_location,
    parse_step_key,
    plan_key,
    redeploy_key,
    shard_update_key,
    source_key,
    store_key,
    train_key,
)
from orchestrator.storage.locations import StorageRoot

# (built key, the string stored lineages hold, what the parser reads back)
KEYS = [
    (train_key("g1"), "train:g1", StepKey(StepKind.TRAIN, generation="g1")),
    (evaluate_key("g1"), "evaluate:g1", StepKey(StepKind.EVALUATE, generation="g1")),
    (plan_key("digits-test", "g1"), "plan:digits-test:g1", StepKey(StepKind.PLAN, "g1", "digits-test")),
    (plan_key("digits-test", "g1", full=True), "plan:digits-test:g1:full",
     StepKey(StepKind.PLAN, "g1", "digits-test", full=True)),
    (shard_update_key(StepKind.EMBED, "gal", 3, "g0-old"), "embed:gal/3:g0-old",
     StepKey(StepKind.EMBED, "g0-old", "gal", shard=3)),
    (shard_update_key(StepKind.SPLIT, "gal", 12, "g1"), "split:gal/12:g1", StepKey(StepKind.SPLIT, "g1", "gal", shard=12)),
    (gallery_eval_key("gal", "g2"), "gallery-eval:gal:g2", StepKey(StepKind.GALLERY_EVAL, "g2", "gal")),
    (gate_key("gal", "g2"), "gate:gal:g2", StepKey(StepKind.GATE, "g2", "gal")),
    (deploy_key("g2"), "deploy:g2", StepKey(StepKind.DEPLOY, generation="g2")),
    (redeploy_key("g0", 4), "redeploy:g0:4", StepKey(StepKind.REDEPLOY, generation="g0", number=4)),
    (integrity_key("s3://b/run/galleries/g/shard-0.faiss"), "integrity:s3://b/run/galleries/g/shard-0.faiss",
     StepKey(StepKind.INTEGRITY, location="s3://b/run/galleries/g/shard-0.faiss")),
    (integrity_key("storage:galleries/g/shard-0.faiss"), "integrity:storage:galleries/g/shard-0.faiss",
     StepKey(StepKind.INTEGRITY, location="storage:galleries/g/shard-0.faiss")),
    (source_key("photos"), "source:photos", StepKey(StepKind.SOURCE, gallery="photos")),
    (store_key("photos", "0a1b2c3d4e5f"), "store:photos:0a1b2c3d4e5f",
     StepKey(StepKind.STORE, gallery="photos", store="0a1b2c3d4e5f")),
]


@pytest.mark.parametrize("built, stored, parsed", KEYS, ids=[k[1] for k in KEYS])
def test_each_constructor_writes_the_stored_string_and_the_parser_reads_it_back(built, stored, parsed):
    assert built == stored
    assert parse_step_key(stored) == parsed
    assert kind_of(stored) is parsed.kind and stored.startswith(parsed.kind.prefix)


def test_every_kind_has_a_constructor_in_the_table():
    assert {parsed.kind for _built, _stored, parsed in KEYS} == set(StepKind)


@pytest.mark.parametrize("key, message", [
    ("fit:g1", "step key 'fit:g1': unknown kind 'fit'"),
    ("train", "step key 'train': nothing after the kind"),
    ("train:", "step key 'train:': nothing after the kind"),
    ("train:g1:g2", "step key 'train:g1:g2': not the form of a 'train' key"),
    ("plan:gal:g1:partial", "not the form of a 'plan' key"),
    ("embed:gal:g1", "not the form of a 'embed' key"),
    ("embed:gal/x:g1", "not the form of a 'embed' key"),
    ("redeploy:g0:two", "not the form of a 'redeploy' key"),
])
def test_a_key_of_no_known_form_is_refused_naming_it(key, message):
    with pytest.raises(ValueError, match=message):
        parse_step_key(key)
    assert kind_of("fit:g1") is None and kind_of("train") is None


def test_a_shard_update_is_an_embed_or_a_split():
    with pytest.raises(ValueError, match="an embed or a split step, not 'deploy'"):
        shard_update_key(StepKind.DEPLOY, "gal", 0, "g1")


def test_only_an_integrity_key_names_a_location_and_only_it_is_moved_with_the_storage():
    old, new = StorageRoot("/data/run"), StorageRoot("/mnt/copy")
    absolute = integrity_key("/data/run/galleries/g/shard-0.faiss")
    recorded = map_location(absolute, old.relative)
    assert recorded == "integrity:storage:galleries/g/shard-0.faiss"
    assert map_location(recorded, new.resolve) == "integrity:/mnt/copy/galleries/g/shard-0.faiss"
    assert integrity_location(recorded) == "storage:galleries/g/shard-0.faiss"
    assert map_location("integrity:", old.relative) == "integrity:"  # the prefix of a query over the steps
    for other in ("plan:g:g0", "embed:g/0:g0", "source:g"):
        assert map_location(other, old.relative) == other == map_location(other, new.resolve)
        assert integrity_location(other) is None
