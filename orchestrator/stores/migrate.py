"""Store rows written by an earlier layout, brought to the current one in place
(``orchestrator verify FILE --migrate-stores``; docs/stores.md).

The earlier layout held ``embedding`` alone (and ``code`` with a binary kind): no ``search``
column, so an approximate index over a hyperbolic gallery was built on ``embedding``, and no
``raw`` column, so a forward path could not read a shard's raw embeddings from the store. Its
lineage records name no ``columns`` (``stores.vectors.recorded_columns``). Searching or mapping such
rows is refused in one line naming them and this command (``stores.vectors.EarlierLayout``).

Per location the lineage records (``integrity:<location>`` steps: served shards and the ones
deployments keep for a rollback), the migration

1. checks the rows against their record (count and digest of the recorded columns): changed rows
   are reported, never migrated;
2. computes the missing columns: ``search`` from the rows' ``embedding`` (``search_rows``, as a
   write computes it), ``raw`` from the shard's Parquet file (sha256 checked against the
   lineage's shard row or the deployment that recorded it) — a location no lineage row gives a
   shard file for is reported and left as it is;
3. writes them into the table or dataset (pgvector: columns added, one transaction per location,
   the approximate index rebuilt on ``search``; Lance: one new version of the dataset with the
   columns, its index rebuilt), and
4. records the rows' new record: ``columns`` and the digest over all of them.

Rows no record names (staged) get no values (NULL): nothing serves them and ``gc`` removes them.
Run it while no pipeline writes to the gallery. Nothing here imports Ray or torch.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from orchestrator.stores.vectors import missing_columns, row_columns, rows_digest, search_rows


def shard_files_by_location(lineage) -> dict[str, tuple[str, str]]:
    """Store location → (its shard's Parquet URI, that file's sha256), from the lineage's shard
    rows and the shard lists deployments recorded."""
    from orchestrator.lineage.step_keys import StepKind, kind_of
    from orchestrator.stores.locations import is_store_uri

    found: dict[str, tuple[str, str]] = {}
    for step in lineage.steps():
        if step.status == "committed" and kind_of(step.key) in (StepKind.DEPLOY, StepKind.REDEPLOY):
            for row in step.outputs.get("shards") or []:
                if is_store_uri(row.get("index_uri")) and row.get("embeddings_uri"):
                    found[row["index_uri"]] = (row["embeddings_uri"], row["sha256"])
    for gallery in lineage.galleries():
        for shard in lineage.shards(gallery.name):
            if is_store_uri(shard.index_uri) and shard.embeddings_uri:
                found[shard.index_uri] = (shard.embeddings_uri, shard.sha256)
    return found


def added_columns(missing: list[str], held: Mapping[str, np.ndarray], raw: np.ndarray | None) -> dict[str, np.ndarray]:
    """The values of a location's ``missing`` columns: ``search`` from its rows' ``embedding``
    (``held``: column → (N, ·) values in id order; ``search_rows``, as a write computes them),
    ``raw``: its shard file's embeddings in that order."""
    return {column: search_rows(held["embedding"]) if column == "search" else np.asarray(raw, np.float32)
            for column in missing}


def migrated_record(record: Mapping[str, Any], ids: np.ndarray, names: list[str],
                    values: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The record of migrated rows: ``columns`` and the digest over all of them (the version in the
    location keeps naming them)."""
    return {**record, "columns": names, "sha256": rows_digest(ids, *(values[column] for column in names))}


def raw_embeddings(files: Mapping[str, tuple[str, str]], uri: str, ids: np.ndarray) -> np.ndarray:
    """The embeddings of the shard file a lineage row gives for ``uri``, in the order of ``ids``
    (``LookupError`` naming the location when there is none or its ids differ)."""
    from orchestrator.gallery.shard_files import read_shard
    from orchestrator.stores.locations import StoreLocation

    if uri not in files:
        raise LookupError(f"{StoreLocation.parse(uri).describe()}: no lineage row names its shard file, whose "
                          "embeddings the raw column is filled from")
    stored = read_shard(files[uri][0], expected_sha256=files[uri][1])
    order = np.argsort(stored.ids, kind="stable")
    if not np.array_equal(stored.ids[order], ids):
        raise LookupError(f"{StoreLocation.parse(uri).describe()}: its shard file {files[uri][0]} holds other ids")
    return np.ascontiguousarray(stored.embeddings[order], dtype=np.float32)


def migrate_stores(lineage) -> list[str]:
    """Migrate every store location the lineage records on an earlier layout (module docstring);
    one line per location: migrated (the columns added) or why not."""
    from orchestrator.integrity import IntegrityError
    from orchestrator.lineage.step_keys import StepKind, integrity_key, integrity_location
    from orchestrator.stores import store_at
    from orchestrator.stores.locations import StoreLocation, is_store_uri
    from orchestrator.stores.vectors import check_rows

    files = shard_files_by_location(lineage)
    pending: dict[tuple[str, str, str], list[tuple[str, dict[str, Any], np.ndarray, dict[str, np.ndarray]]]] = {}
    stores: dict[tuple[str, str, str], Any] = {}
    lines = []
    for step in lineage.steps(StepKind.INTEGRITY.prefix):
        uri, record = integrity_location(step.key), dict(step.outputs)
        if step.status != "committed" or not is_store_uri(uri) or not missing_columns(record):
            continue
        location = StoreLocation.parse(uri)
        names, missing = row_columns(record["space"], record.get("index", "exact"), "binary" in record), missing_columns(record)
        try:
            ids, held = store_at(uri, record).read_rows(uri, [column for column in names if column not in missing])
            if not len(ids):
                lines.append(f"not migrated {location.describe()}: no rows (gc removed them)")
                continue
            check_rows(location.describe(), record, ids, held)
            raw = raw_embeddings(files, uri, ids) if "raw" in missing else None
        except (IntegrityError, LookupError) as error:
            lines.append(f"not migrated {error}")
            continue
        added = added_columns(missing, held, raw)
        key = (location.scheme, location.where, location.table)
        stores.setdefault(key, store_at(uri, record))
        pending.setdefault(key, []).append((uri, migrated_record(record, ids, names, {**held, **added}), ids, added))
    for key, locations in pending.items():
        stores[key].add_columns(key[2], [(uri, ids, added) for uri, _record, ids, added in locations],
                                locations[0][1]["space"])
        for uri, record, _ids, added in locations:
            lineage.commit_step(integrity_key(uri), record)
            lines.append(f"migrated {StoreLocation.parse(uri).describe()}: added {', '.join(added)}")
    return lines
