"""What ``orchestrator lineage`` prints: the generation tree and the gallery shard table
(``lineage_tree_text``), or everything as one JSON document (``lineage_json``, for ``--json``).

Key metrics of a generation g come from the compatibility table: ``self`` = g's queries against
g's own gallery, ``cross→p`` = g's queries against its parent p's gallery (the backward-compatible
search a mixed-generation gallery relies on). Shown: CMC@1 and mAP, when recorded. A tuning
sweep's candidates appear under their parent with their outcome instead of a status. A
generation the health check stopped has status ``failed``; its ``train:<gen>`` step is listed as
failed with the check's one line (``stopped by the health check: g1: own CMC@1 ...``), and a
collapsed sweep trial shows as ``candidate collapsed``.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from orchestrator.lineage.records import CandidateRecord, CompatibilityRecord, GenerationRecord
from orchestrator.lineage.store import LineageStore
from orchestrator.metrics import KEY_METRICS

HEALTH_STOP = "health/stop"  # ``orchestrator.training.config.STOP``: a health check's line in a generation's metrics


def metric_label(metric: str) -> str:
    """``cmc@1`` → ``CMC@1``, ``map`` → ``mAP``; other names unchanged."""
    if metric.lower() == "map":
        return "mAP"
    if metric.lower().startswith("cmc@"):
        return "CMC@" + metric[4:]
    return metric


def _metric_group(title: str, values: dict[str, Optional[float]], metrics: Sequence[str]) -> Optional[str]:
    parts = []
    for metric in metrics:
        if metric in values:
            value = values[metric]
            parts.append(f"{metric_label(metric)} {'n/a' if value is None else f'{value:.3f}'}")
    return f"{title} " + " ".join(parts) if parts else None


def _key_metrics(gen: GenerationRecord, compat: Sequence[CompatibilityRecord], datasets: Sequence[str],
                 metrics: Sequence[str]) -> str:
    groups = []
    for dataset in datasets:
        def values(gallery: str, dataset: str = dataset) -> dict[str, Optional[float]]:
            return {c.metric: c.value for c in compat
                    if c.query == gen.name and c.gallery == gallery and c.dataset == dataset}
        found = [_metric_group("self", values(gen.name), metrics)]
        if gen.parent is not None:
            found.append(_metric_group(f"cross→{gen.parent}", values(gen.parent), metrics))
        text = " | ".join(g for g in found if g)
        if text:
            groups.append(f"{dataset}: {text}" if len(datasets) > 1 else text)
    return "; ".join(groups)


def _tree_rows(generations: Sequence[GenerationRecord]) -> list[tuple[str, GenerationRecord]]:
    """(drawing prefix + name, generation) in depth-first order, with ├─ └─ │ connectors."""
    names = {g.name for g in generations}
    children: dict[Optional[str], list[GenerationRecord]] = {}
    for g in generations:  # list_generations order: parents first, siblings by creation
        children.setdefault(g.parent if g.parent in names else None, []).append(g)
    rows: list[tuple[str, GenerationRecord]] = []

    def walk(gen: GenerationRecord, lead: str, connector: str) -> None:
        rows.append((lead + connector + gen.name, gen))
        kids = children.get(gen.name, [])
        child_lead = lead + ("" if not connector else ("   " if connector == "└─ " else "│  "))
        for i, kid in enumerate(kids):
            walk(kid, child_lead, "└─ " if i == len(kids) - 1 else "├─ ")

    for root in children.get(None, []):
        walk(root, "", "")
    return rows


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    fmt = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [fmt(header), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows]


def lineage_tree_text(store: LineageStore, dataset: Optional[str] = None,
                      metrics: Sequence[str] = KEY_METRICS) -> str:
    """The generation tree (indented by parent: name, method, status, key metrics, the serving
    generation marked), the gallery shard table (which generation each shard holds), and a
    one-line step summary naming unfinished steps. ``dataset`` picks one evaluation set; by
    default every recorded one is shown."""
    generations = store.list_generations()
    candidates = {c.name: c for c in store.candidates()}
    compat = store.compatibility_values(dataset)
    datasets = sorted({c.dataset for c in compat})
    serving = store.current_deployment()
    lines: list[str] = []

    title = "Generations"
    if datasets:
        title += f" (metrics on {', '.join(datasets)})"
    lines.append(title)
    if not generations:
        lines.append("  (none)")
    else:
        tree = _tree_rows(generations)
        statuses = {g.name: _status(g, candidates.get(g.name)) for _, g in tree}
        label_w = max(len(label) for label, _ in tree)
        method_w = max(len(g.method or "-") for _, g in tree)
        status_w = max(len(status) for status in statuses.values())
        for label, gen in tree:
            cells = [label.ljust(label_w), (gen.method or "-").ljust(method_w), statuses[gen.name].ljust(status_w)]
            metrics_text = _key_metrics(gen, compat, datasets, metrics)
            if metrics_text:
                cells.append(metrics_text)
            if serving is not None and serving.generation == gen.name:
                cells.append("[serving]")
            lines.append("  ".join(cells).rstrip())

    lines.append("")
    lines.append("Gallery shards")
    shard_rows = []
    for gallery in store.galleries():
        for shard in store.shards(gallery.name):
            shard_rows.append([gallery.name, str(shard.index), "-" if shard.n_items is None else str(shard.n_items),
                               shard.generation or "-", (shard.sha256 or "-")[:12]])
    if shard_rows:
        lines.extend(_table(["gallery", "shard", "items", "generation", "sha256"], shard_rows))
    else:
        lines.append("  (none)")
    summary = _backfill_summary(store)
    if summary:
        lines.append("")
        lines.append("Backfills (committed)")
        lines.extend(summary)

    steps = store.steps()
    if steps:
        counts = {status: sum(s.status == status for s in steps) for status in ("committed", "started", "failed")}
        lines.append("")
        lines.append("Steps: " + ", ".join(f"{n} {status}" for status, n in counts.items()))
        for s in steps:
            if s.status != "committed":
                error = f": {s.error.strip().splitlines()[-1]}" if s.error else ""
                lines.append(f"  {s.status:<9} {s.key} (attempt {s.attempts}){error}")
    return "\n".join(lines) + "\n"


def _backfill_summary(store: LineageStore) -> list[str]:
    """One line per (gallery, from → to generation): shards and items moved, oldest first."""
    totals: dict[tuple[str, str, str], list[int]] = {}
    for backfill in store.backfills():
        if backfill.status != "committed":
            continue
        key = (backfill.gallery, backfill.from_generation or "(empty)", backfill.to_generation)
        shards_items = totals.setdefault(key, [0, 0])
        shards_items[0] += 1
        shards_items[1] += backfill.items or 0
    return [f"  {gallery}: {source} → {target}: {shards} shard(s), {items} items"
            for (gallery, source, target), (shards, items) in totals.items()]


def _status(gen: GenerationRecord, candidate: Optional[CandidateRecord]) -> str:
    """A generation's status; a sweep candidate's shows its outcome and epochs (never deployed), a
    trial the health check stopped as ``collapsed`` (recorded as stopped, with the check's line)."""
    if candidate is None:
        return gen.status
    outcome = "collapsed" if (gen.metrics or {}).get(HEALTH_STOP) else candidate.outcome
    return f"candidate {outcome} @{candidate.epochs} ep"


def lineage_json(store: LineageStore) -> dict[str, Any]:
    """Everything the store holds as one JSON-serialisable dict (datetimes as ISO strings):
    generations (parents first), compatibility values, galleries with their shards, backfills,
    deployments and the current one, steps, and pipeline runs."""
    current = store.current_deployment()
    return {
        "url": store.url.render_as_string(hide_password=True),
        "generations": [g.to_json() for g in store.list_generations()],
        "compatibility": [c.to_json() for c in store.compatibility_values()],
        "galleries": [
            {**g.to_json(), "shards": [s.to_json() for s in store.shards(g.name)]} for g in store.galleries()
        ],
        "backfills": [b.to_json() for b in store.backfills()],
        "deployments": [d.to_json() for d in store.deployments()],
        "current_deployment": None if current is None else current.to_json(),
        "steps": [s.to_json() for s in store.steps()],
        "candidates": [c.to_json() for c in store.candidates()],
        "runs": [r.to_json() for r in store.runs()],
    }
