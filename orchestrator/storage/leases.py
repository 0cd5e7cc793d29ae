"""Leases: the files a running server holds, so that ``orchestrator gc`` leaves them in place.

Each server replica writes ``<storage>/serving/leases/<holder>.json`` = ``{"holder", "expires",
"uris"}``: the shard files (embeddings and indexes) of every snapshot it serves or still answers
an in-flight request from. It rewrites the file at each lineage poll (``LEASE_TTL_S`` ahead) and
removes it when it stops; ``orchestrator serve`` removes its replicas' leases by their common
prefix when it stops (``drop_leases``), those of replicas killed before they could as well. ``held_uris`` is what
``gc`` adds to the files it keeps: every URI of
every lease that has not expired, so a server that died without removing its lease blocks ``gc``
for at most ``LEASE_TTL_S``.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.storage.filesystem import join_uri, list_dir, read_json, remove, write_json_atomic

LEASE_FOLDER = "serving/leases"
#: Seconds a lease stays valid after it was written (a server rewrites it every lineage poll).
LEASE_TTL_S = 60.0


def lease_uri(storage: str, holder: str) -> str:
    return join_uri(storage, LEASE_FOLDER, f"{holder}.json")


def write_lease(storage: str, holder: str, uris: Iterable[str], storage_options: Mapping[str, Any] | None = None,
                ttl_s: float = LEASE_TTL_S) -> None:
    """Record that ``holder`` keeps ``uris`` open for the next ``ttl_s`` seconds."""
    write_json_atomic(lease_uri(storage, holder),
                      {"holder": holder, "expires": time.time() + ttl_s, "uris": sorted(set(uris))}, storage_options)


def drop_lease(storage: str, holder: str, storage_options: Mapping[str, Any] | None = None) -> None:
    remove(lease_uri(storage, holder), missing_ok=True, storage_options=storage_options)


def drop_leases(storage: str, prefix: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Remove every lease whose holder's name starts with ``prefix`` (the replicas of one stopped
    server, whatever became of them); returns their holders."""
    folder = join_uri(storage, LEASE_FOLDER)
    try:
        names = list_dir(folder, storage_options)
    except FileNotFoundError:
        return []
    holders = [name[:-len(".json")] for name in names if name.startswith(prefix) and name.endswith(".json")]
    for holder in holders:
        drop_lease(storage, holder, storage_options)
    return holders


def held_uris(storage: str, storage_options: Mapping[str, Any] | None = None, now: float | None = None) -> set[str]:
    """Every URI an unexpired lease under ``storage`` holds (empty when no server runs)."""
    folder = join_uri(storage, LEASE_FOLDER)
    try:
        names = list_dir(folder, storage_options)
    except FileNotFoundError:
        return set()
    now = time.time() if now is None else now
    held: set[str] = set()
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            lease = read_json(join_uri(folder, name), storage_options)
        except (FileNotFoundError, ValueError):  # removed or being replaced meanwhile
            continue
        if float(lease.get("expires", 0)) > now:
            held |= {str(uri) for uri in lease.get("uris", [])}
    return held
