"""Leases: what running servers hold, as ``gc`` reads it; an expired or dropped lease holds nothing."""
import time

from orchestrator.storage.leases import drop_lease, held_uris, lease_uri, write_lease


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
