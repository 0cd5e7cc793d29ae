"""A lost or emptied lineage rebuilt from the storage's own files (``orchestrator verify FILE
--rebuild-lineage``).

Everything served is described by files the storage keeps:

- a generation by its ``generations/<name>/card.json`` (method, parameters, space, parent, the
  sha256 of its weights): recovered when ``model.safetensors`` hashes to the card's sha256, parents
  before children (a generation whose parent was not recovered is not either);
- a gallery's deployment by its last plan, ``galleries/<gallery>/plans/<generation>.json`` of the
  newest recovered generation (children after parents) that has one: that generation serves;
- its shards by their files ``shard-<index>/<generation>.<item-set version>.{parquet,index}``: per
  shard index the pair of the serving generation or its nearest ancestor, recovered when the
  Parquet's item set hashes to the version in its name, every row was embedded by the generation
  the name says, and the index holds as many items (the index's hashes are then recorded as they
  are now: ``integrity.index_record``).

- the compatibility values between recovered generations from the run's report,
  ``reports/compatibility.json`` (matrix row: query generation, column: gallery generation), as
  the report says: the lineage never hashed it (a router refuses to serve a shard of a generation
  it holds no value for).

What disagrees is refused and listed, and so is what files cannot tell (the evaluate steps,
backfill history, earlier deployments, sweep candidates): ``Recovery.lines``. The rebuilt
lineage serves, searches and verifies (the stored evaluation embeddings are listed unreferenced).
Shards are told apart by generation, which holds for whole-shard backfills; a shard folder with two
files of one generation (an item-level backfill rewrote it) is refused, naming the shard.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from orchestrator.integrity import index_record, sha256_bytes, trained_outputs
from orchestrator.lineage.step_keys import deploy_key, integrity_key, plan_key, train_key
from orchestrator.models.checkpoint_layout import CARD_FILE, WEIGHTS_FILE
from orchestrator.storage import join_uri, read_bytes

_SHARD_FILE = re.compile(r"(?P<generation>.+)\.(?P<version>[0-9a-f]{12})\.parquet")
_SHARD_FOLDER = re.compile(r"shard-(\d{5})")


@dataclass
class Recovery:
    """What ``rebuild_lineage`` recorded, and what it refused or could not recover."""

    generations: list[str] = field(default_factory=list)
    shards: int = 0
    compatibility: int = 0
    deployed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    not_recovered: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return ([f"REFUSED {line}" for line in self.refused]
                + [f"not recovered: {line}" for line in self.not_recovered]
                + [f"rebuilt: {len(self.generations)} generation(s) ({', '.join(self.generations) or 'none'}), "
                   f"{self.shards} shard(s), {self.compatibility} compatibility value(s), "
                   f"serving {', '.join(self.deployed) or 'nothing'}"])


def _cards(storage: str, recovery: Recovery) -> dict[str, dict]:
    """Each generation's card whose weights hash to the card's sha256, by name."""
    cards = {}
    folder = os.path.join(storage, "generations")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        checkpoint = os.path.join(folder, name)
        if os.path.islink(checkpoint) or not os.path.isfile(os.path.join(checkpoint, CARD_FILE)):
            continue
        try:
            card = json.loads(read_bytes(join_uri(checkpoint, CARD_FILE)))
            weights = sha256_bytes(read_bytes(join_uri(checkpoint, WEIGHTS_FILE)))
        except (OSError, ValueError) as error:
            recovery.refused.append(f"generation {name}: {error}")
            continue
        if card.get("name") != name or weights != card.get("sha256"):
            recovery.refused.append(f"generation {name}: its weights hash to {weights}, its card holds "
                                    f"{card.get('sha256')} (or the card names {card.get('name')!r})")
            continue
        cards[name] = card
    return cards


def _in_tree_order(cards: dict[str, dict], recovery: Recovery) -> list[str]:
    """The names, parents before children; one whose parent is missing is refused."""
    ordered: list[str] = []
    pending = dict(cards)
    while pending:
        ready = [name for name, card in pending.items() if card.get("parent") in (None, *ordered)]
        if not ready:
            for name, card in pending.items():
                recovery.refused.append(f"generation {name}: its parent {card.get('parent')!r} was not recovered")
            break
        for name in sorted(ready, key=lambda n: (pending[n].get("created_at") or "", n)):
            ordered.append(name)
            del pending[name]
    return ordered


def _record_generation(store, storage: str, card: dict) -> None:
    checkpoint = join_uri(storage, "generations", card["name"])
    method = card["method"]
    store.upsert_generation(card["name"], parent=card.get("parent"), method=method["name"], params=method["params"],
                            arch=card["encoder"]["arch"], space=card["space"], curv=card.get("curv"))
    store.mark_generation_trained(card["name"], checkpoint, card["sha256"], step=train_key(card["name"]),
                                  step_outputs=trained_outputs(checkpoint, card["sha256"]))


def _lineage_of(name: str, cards: dict[str, dict]) -> list[str]:
    """``name`` and its ancestors, nearest first."""
    chain = []
    while name is not None and name in cards:
        chain.append(name)
        name = cards[name].get("parent")
    return chain


def _shard(uri: str, generation: str, version: str):
    """(the shard's ids, its index file's record, the Parquet's sha256) after the checks of the
    module docstring; ValueError naming what disagrees."""
    from orchestrator.gallery import read_shard
    from orchestrator.gallery.shard_files import item_set_version
    from orchestrator.index.factory import index_from_bytes

    data = read_bytes(uri)
    shard = read_shard(uri)
    if item_set_version(shard.ids) != version:
        raise ValueError(f"{uri}: its items hash to {item_set_version(shard.ids)}, its name says {version}")
    if shard.generation != generation:
        raise ValueError(f"{uri}: embedded by {shard.generation!r}, its name says {generation!r}")
    index_uri = uri[:-len(".parquet")] + ".index"
    index_data = read_bytes(index_uri)
    if index_from_bytes(index_data).ntotal != len(shard.ids):
        raise ValueError(f"{index_uri}: holds other items than {uri}")
    return shard.ids, index_record(index_data, shard.ids), sha256_bytes(data)


def _record_gallery(store, storage: str, gallery: str, cards: dict[str, dict], order: list[str],
                    recovery: Recovery) -> None:
    from orchestrator.lineage.records import ShardAssignment
    from orchestrator.pipeline.operations import shard_snapshot

    root = join_uri(storage, "galleries", gallery)
    planned = [name for name in order if os.path.isfile(os.path.join(root, "plans", f"{name}.json"))]
    if not planned:
        recovery.not_recovered.append(f"gallery {gallery}: no plan of a recovered generation")
        return
    serving = planned[-1]
    plan_uri = join_uri(root, "plans", f"{serving}.json")
    plan_bytes = read_bytes(plan_uri)
    plan = json.loads(plan_bytes)
    nearest = _lineage_of(serving, cards)
    assignments, records = [], {}
    folders = sorted(f for f in os.listdir(root)
                     if _SHARD_FOLDER.fullmatch(f) and not os.path.islink(os.path.join(root, f)))
    for folder in folders:
        index = int(folder[len("shard-"):])
        files = {}
        for name in os.listdir(os.path.join(root, folder)):
            match = _SHARD_FILE.fullmatch(name)
            if match and match["generation"] in nearest:
                files.setdefault(match["generation"], []).append((match["version"], join_uri(root, folder, name)))
        holder = next((g for g in nearest if g in files), None)
        if holder is None:
            continue
        if len(files[holder]) != 1:
            recovery.refused.append(f"gallery {gallery} shard {index}: {len(files[holder])} files of {holder}; "
                                    "which one served is not known")
            continue
        version, uri = files[holder][0]
        try:
            ids, record, sha256 = _shard(uri, holder, version)
        except (OSError, ValueError) as error:
            recovery.refused.append(f"gallery {gallery} shard {index}: {error}")
            continue
        index_uri = uri[:-len(".parquet")] + ".index"
        assignments.append(ShardAssignment(index, holder, uri, index_uri, sha256, len(ids)))
        records[index_uri] = record
    if not assignments:
        recovery.not_recovered.append(f"gallery {gallery}: no shard file of {serving} or its ancestors")
        return
    store.upsert_gallery(gallery, n_items=sum(a.n_items for a in assignments),
                         n_shards=max(a.index for a in assignments) + 1)
    for index_uri, record in records.items():
        store.commit_step(integrity_key(index_uri), record)
    shards = store.assign_shards(gallery, assignments, grow=True)
    entries = plan.get("entries", [])
    store.commit_step(plan_key(gallery, serving), {"plan_uri": plan_uri, "entries": len(entries), "sha256":
                                                    sha256_bytes(plan_bytes),
                                                    "items": sum(e.get("num_items", 0) for e in entries)})
    store.deploy(serving, step=deploy_key(serving),
                 step_outputs={"generation": serving, "gate": None, "shards": shard_snapshot(
                     [s for s in shards if s.n_items])})
    recovery.shards += len(assignments)
    recovery.deployed.append(f"{serving} on {gallery}")


def _record_compatibility(store, storage: str, dataset: str, recovered: list[str], recovery: Recovery) -> None:
    report = os.path.join(storage, "reports", "compatibility.json")
    if not os.path.isfile(report):
        recovery.not_recovered.append("compatibility values (no reports/compatibility.json)")
        return
    try:
        document = json.loads(read_bytes(report))
        names, matrices = list(document["generations"]), dict(document["matrices"])
    except (ValueError, KeyError, TypeError) as error:
        recovery.refused.append(f"{report}: not a compatibility report ({error})")
        return
    rows = [(query, gallery, metric, matrix[t][k], dataset)
            for metric, matrix in matrices.items() for t, query in enumerate(names) for k, gallery in enumerate(names)
            if query in recovered and gallery in recovered and matrix[t][k] is not None]
    if rows:
        recovery.compatibility = store.record_compatibility(rows)


def rebuild_lineage(store, storage: str, dataset: str) -> Recovery:
    """Record in the empty lineage ``store`` what the local storage root ``storage`` holds (module
    docstring); compatibility values are recorded for the evaluation split ``dataset``. ValueError
    when the lineage already knows a generation (nothing is changed)."""
    if store.list_generations():
        raise ValueError(f"the lineage {store.url.render_as_string(hide_password=True)} is not empty; rebuilding "
                         "writes only into a lost (missing or emptied) lineage: move it away first")
    recovery = Recovery()
    cards = _cards(storage, recovery)
    order = _in_tree_order(cards, recovery)
    for name in order:
        _record_generation(store, storage, cards[name])
        recovery.generations.append(name)
    _record_compatibility(store, storage, dataset, order, recovery)
    galleries = os.path.join(storage, "galleries")
    for gallery in sorted(os.listdir(galleries)) if os.path.isdir(galleries) else []:
        if not os.path.islink(os.path.join(galleries, gallery)):
            _record_gallery(store, storage, gallery, {n: cards[n] for n in order}, order, recovery)
    recovery.not_recovered += ["the evaluate steps (the evaluation embeddings files stay unreferenced)",
                               "backfill history, earlier deployments and sweep candidates"]
    return recovery
