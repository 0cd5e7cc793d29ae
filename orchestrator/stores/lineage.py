"""Which stores a lineage has written to: recorded before a gallery step writes its first row
(step ``store:<gallery>:<hash of the store>``), so ``verify`` and ``gc`` find the rows of an update
that never committed, with nothing but the lineage."""
from __future__ import annotations

import hashlib
from typing import Any

from orchestrator.lineage.step_keys import StepKind, kind_of, parse_step_key, store_key
from orchestrator.stores.protocol import RowStore


def store_outputs(gallery_store) -> dict[str, Any]:
    """What the lineage records of a store: enough to open it again (no password)."""
    if gallery_store.kind == "pgvector":
        return {"kind": "pgvector", "url": gallery_store.url, "prefix": gallery_store.prefix,
                "index": gallery_store.index, "index_options": dict(gallery_store.index_options),
                "overfetch": gallery_store.overfetch}
    return {"kind": gallery_store.kind, "path": gallery_store.path, "index": gallery_store.index,
            "index_options": dict(gallery_store.index_options), "overfetch": gallery_store.overfetch}


def record_store(lineage, gallery: str, gallery_store) -> None:
    """Record that ``gallery``'s shards are written to ``gallery_store`` (idempotent)."""
    outputs = store_outputs(gallery_store)
    name = hashlib.sha256(repr(sorted((k, str(v)) for k, v in outputs.items() if k in ("kind", "url", "prefix", "path"))
                               ).encode()).hexdigest()[:12]
    lineage.commit_step(store_key(gallery, name), outputs)


def recorded_stores(lineage, steps=None, gallery: str | None = None) -> list[RowStore]:
    """The store objects of every ``store:`` step of the lineage (``steps``: its steps, resolved;
    ``gallery``: of that gallery only)."""
    from orchestrator.stores.pgvector import PgVectorStore

    found = []
    kind = StepKind.STORE
    for step in (lineage.steps(kind.prefix) if steps is None else [s for s in steps if kind_of(s.key) is kind]):
        if step.status != "committed" or (gallery is not None and parse_step_key(step.key).gallery != gallery):
            continue
        out = step.outputs
        if out.get("kind") == "pgvector":
            found.append(PgVectorStore(out["url"], out["prefix"], out.get("index", "exact"),
                                       dict(out.get("index_options") or {}), int(out.get("overfetch", 4))))
        elif out.get("kind") == "lance":
            from orchestrator.stores.lance import LanceStore

            found.append(LanceStore(out["path"], out.get("index", "exact"), dict(out.get("index_options") or {}),
                                    int(out.get("overfetch", 4))))
    return found
