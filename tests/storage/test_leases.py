"""Leases: what running servers hold, as ``gc`` reads it; an expired or dropped lease holds nothing."""
import time

from orchestrator.storage.leases import drop_lease, drop_leases, held_uris, lease_uri, write_lease


def test_unexpired_leases_hold_their_uris_until_dropped_or_expired(tmp_path):
    storage = str(tmp_path)
    assert held_uris(storage) == set()  # no server ever ran
    write_lease(storage, "replica-a", [f"{storage}/galleries/g/shard-00000/a.parquet", f"{storage}/x.index"])
    write_lease(storage, "replica-b", [f"{storage}/galleries/g/shard-00001/b.parquet"], ttl_s=30)
    assert held_uris(storage) == {f"{storage}/galleries/g/shard-00000/a.parquet", f"{storage}/x.index",
                                  f"{storage}/galleries/g/shard-00001/b.parquet"}
    assert held_uris(storage, now=time.time() + 45) == {f"{storage}/galleries/g/shard-00000/a.parquet",
                                                         f"{storage}/x.index"}  # b's lease expired
    drop_lease(storage, "replica-a")
    assert held_uris(storage) == {f"{storage}/galleries/g/shard-00001/b.parquet"}
    drop_lease(storage, "replica-a")  # dropping twice is fine
    (tmp_path / "serving" / "leases" / "broken.json").write_text("{not json")  # half-written: ignored
    assert held_uris(storage) == {f"{storage}/galleries/g/shard-00001/b.parquet"}
    assert lease_uri(storage, "replica-b").endswith("/serving/leases/replica-b.json")


def test_a_stopped_server_drops_the_leases_of_its_replicas_by_their_prefix_and_no_other(tmp_path):
    storage = str(tmp_path)
    assert drop_leases(storage, "serve-1a2b-") == []  # no lease folder yet
    for holder in ("serve-1a2b-x", "serve-1a2b-y", "serve-9f9f-x"):
        write_lease(storage, holder, [f"{storage}/{holder}.index"])
    assert sorted(drop_leases(storage, "serve-1a2b-")) == ["serve-1a2b-x", "serve-1a2b-y"]
    assert held_uris(storage) == {f"{storage}/serve-9f9f-x.index"}  # another server's stays
