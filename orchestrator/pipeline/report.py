"""Compatibility report files of a pipeline run: JSON, CSV and one PNG heatmap per metric."""
from __future__ import annotations

import csv
import io
import math
from typing import Any, Iterable, Sequence

import numpy as np

from orchestrator.metrics import KEY_METRICS, METRICS, backfill_saved
from orchestrator.storage import join_uri, write_bytes_atomic, write_json_atomic


def update_label(parent: str, generation: str) -> str:
    """How reports name the update from ``parent`` to ``generation``: ``g1 → g2``."""
    return f"{parent} → {generation}"


def compatibility_matrix(values: Iterable[Any], names: Sequence[str], metric: str) -> np.ndarray:
    """(T, T) matrix of ``metric`` from lineage compatibility records (query row, gallery column);
    NaN where nothing was recorded."""
    index = {name: i for i, name in enumerate(names)}
    matrix = np.full((len(names), len(names)), np.nan)
    for value in values:
        if value.metric == metric and value.query in index and value.gallery in index and value.value is not None:
            matrix[index[value.query], index[value.gallery]] = value.value
    return matrix


def format_matrix(matrix: np.ndarray, names: Sequence[str], metric: str) -> str:
    """Fixed-width text of a compatibility matrix (rows: query generation, columns: gallery)."""
    width = max(len(metric), len("0.0000"), *(len(n) for n in names)) + 2
    lines = [f"{metric:<{width}}" + "".join(f"{n:>{width}}" for n in names)]
    for name, row in zip(names, matrix):
        cells = "".join(f"{'·' if math.isnan(v) else f'{v:.4f}':>{width}}" for v in row)
        lines.append(f"{name:<{width}}{cells}")
    return "\n".join(lines)


def write_report(uri: str, names: Sequence[str], values: Iterable[Any], summaries: dict[str, dict[str, Any]],
                 storage_options: dict | None = None) -> list[str]:
    """Write ``compatibility.json``, ``compatibility.csv`` and ``compatibility_<metric>.png`` under
    ``uri``; returns the written URIs."""
    values = list(values)
    matrices = {metric: compatibility_matrix(values, names, metric) for metric in METRICS}
    written = []
    document = {
        "generations": list(names),
        "matrices": {m: [[None if math.isnan(v) else v for v in row] for row in mat.tolist()] for m, mat in matrices.items()},
        "updates": summaries,
    }
    target = join_uri(uri, "compatibility.json")
    write_json_atomic(target, document, storage_options=storage_options)
    written.append(target)

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["query_generation", "gallery_generation", *METRICS])
    for t, query in enumerate(names):
        for k, gallery in enumerate(names):
            row = [matrices[m][t, k] for m in METRICS]
            if not all(math.isnan(v) for v in row):
                writer.writerow([query, gallery, *("" if math.isnan(v) else f"{v:.6f}" for v in row)])
    target = join_uri(uri, "compatibility.csv")
    write_bytes_atomic(target, buffer.getvalue().encode(), storage_options=storage_options)
    written.append(target)

    for metric, matrix in matrices.items():
        target = join_uri(uri, f"compatibility_{metric.replace('@', '')}.png")
        write_bytes_atomic(target, heatmap_png(matrix, names, metric), storage_options=storage_options)
        written.append(target)
    return written


def heatmap_png(matrix: np.ndarray, names: Sequence[str], metric: str) -> bytes:
    """PNG bytes of the matrix as an annotated heatmap (empty cells left blank)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = 1.2 + 0.9 * len(names)
    figure, axes = plt.subplots(figsize=(size + 1.5, size))
    image = axes.imshow(np.ma.masked_invalid(matrix), vmin=0.0, vmax=1.0, cmap="viridis")
    axes.set_xticks(range(len(names)), labels=names, rotation=45, ha="right")
    axes.set_yticks(range(len(names)), labels=names)
    axes.set_xlabel("gallery generation")
    axes.set_ylabel("query generation")
    axes.set_title(f"compatibility ({metric})")
    for (row, column), value in np.ndenumerate(matrix):
        if not math.isnan(value):
            axes.text(column, row, f"{value:.3f}", ha="center", va="center",
                      color="black" if value > 0.6 else "white", fontsize=9)
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()


GALLERY_COLUMNS = ("serving", "same-generation", *(f"same-generation {m}" for m in KEY_METRICS),
                   *(f"search {m}" for m in METRICS), "searched items", "evaluated items",
                   *(f"mixed {m}" for m in METRICS), *(f"full {m}" for m in METRICS),
                   *(f"backfill saved {m}" for m in KEY_METRICS), "curve area (map)", "curve backfill saved (map)",
                   "items by generation", "not searched")


def gallery_report_rows(evaluations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per served generation from its ``gallery-eval`` step outputs:

    - same-generation: the previous served generation on a gallery wholly its own (before the
      update; empty for the first);
    - search: what the router serves through the stored shard indexes (older shards admitted by
      the compatibility criterion; ``searched items`` of all, ``not searched`` says why);
    - mixed: the exact ranking of the served gallery, every shard along its comparison path;
    - full: a full backfill (every item embedded by the serving generation);
    - backfill saved (``metrics.backfill_saved``): the share of the full backfill's gain over the
      same-generation baseline that the search serves, and, along the backfill curve (if traced),
      ``[fraction re-embedded, share]`` pairs on mAP (the first at 0 % re-embedded);
    - the backfill curve's area (if traced) and the items each generation's embeddings cover.
    Evaluations that were skipped (an unlabelled gallery) give no row."""
    rows = []
    for outputs in evaluations:
        if "skipped" in outputs:
            continue
        mixed, full = outputs["mixed"], outputs["full_backfill"]
        same, search = outputs.get("same_generation") or {}, outputs["search"]
        curve = outputs.get("curve") or {}
        old_map = same.get("map")
        saved = [[fraction, _saved(value, old_map, full["map"])] for fraction, value in curve.get("points", [])]
        rows.append({
            "serving": outputs["serving"],
            "same-generation": same.get("generation", ""),
            **{f"same-generation {m}": same.get(m) for m in KEY_METRICS},
            **{f"search {m}": search[m] for m in METRICS},
            "searched items": f"{search['searched_items']}/{search['gallery_items']}",
            "evaluated items": f"{outputs.get('evaluated_items', search['gallery_items'])}/{search['gallery_items']}",
            **{f"mixed {m}": mixed[m] for m in METRICS}, **{f"full {m}": full[m] for m in METRICS},
            **{f"backfill saved {m}": _saved(search[m], same.get(m), full[m]) for m in KEY_METRICS},
            "curve area (map)": curve.get("area"),
            "curve backfill saved (map)": saved if old_map is not None else None,
            "items by generation": " ".join(f"{g}={n}" for g, n in outputs["items_by_generation"].items()),
            "not searched": search.get("skipped", ""),
        })
    return rows


def _saved(served: float | None, old: float | None, full: float) -> float | None:
    """``backfill_saved`` of the served value, None where there is no baseline, search result or gain."""
    if served is None or old is None:
        return None
    value = backfill_saved(served, old, full)
    return None if math.isnan(value) else value


def format_gallery_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width table of ``gallery_report_rows`` (mAP columns, backfill saved on mAP; CMC@1 in the CSV/JSON), and a
    line per served generation that could not search part of its gallery."""
    def cell(value: Any, width: int) -> str:
        return f"{'-':>{width}}" if value is None else f"{value:>{width}.4f}"

    lines = [f"{'served gallery':<16}{'same-gen map':>13}{'search map':>12}{'mixed map':>11}{'full map':>10}"
             f"{'saved map':>11}{'searched':>11}  items by generation"]
    for row in rows:
        lines.append(f"{row['serving']:<16}{cell(row['same-generation map'], 13)}{cell(row['search map'], 12)}"
                     f"{cell(row['mixed map'], 11)}{cell(row['full map'], 10)}{cell(row['backfill saved map'], 11)}"
                     f"{row['searched items']:>11}  {row['items by generation']}")
    for row in rows:
        if row["not searched"]:
            lines.append(f"{row['serving']} did not search: {row['not searched']}")
    return "\n".join(lines)


def write_gallery_report(uri: str, gallery: str, rows: Sequence[dict[str, Any]]) -> list[str]:
    """``gallery-<name>.json`` and ``.csv`` of ``gallery_report_rows`` under ``uri``; returns the files."""
    if not rows:
        return []
    json_uri, csv_uri = join_uri(uri, f"gallery-{gallery}.json"), join_uri(uri, f"gallery-{gallery}.csv")
    write_json_atomic(json_uri, list(rows))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(GALLERY_COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_bytes_atomic(csv_uri, buffer.getvalue().encode("utf-8"))
    return [json_uri, csv_uri]
