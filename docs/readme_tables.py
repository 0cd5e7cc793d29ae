"""The README's result tables, generated from the report files of a default run.

    python3 -m orchestrator run pipelines/lifelong.yaml        # writes runs/lifelong/reports/
    python3 docs/readme_tables.py runs/lifelong/reports          # prints the tables
    python3 docs/readme_tables.py runs/lifelong/reports --write README.md
    python3 docs/readme_tables.py runs/lifelong/reports --check README.md   # exit 1 when they differ

Each table sits in README.md between ``<!-- readme-table:NAME -->`` and ``<!-- /readme-table:NAME -->``
and is made here from ``compatibility.json`` (the compatibility matrices and the update
summaries), ``gallery-<gallery>.json`` (the served gallery after each deployment) and
``backfill-<gallery>-<generation>.csv`` (the backfilling curves) of one run. A copy of the
report the README shows is kept in ``tests/docs/readme_report/``; ``tests/docs/test_readme_tables.py``
checks that the README's tables are exactly what this script makes of it, so the README changes
only with a new report. Standard library only: it runs without the package's dependencies.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

GALLERY = "digits-test"
#: How the README names the updates and the deployments of ``pipelines/lifelong.yaml``.
UPDATE_LABELS = {"g0-old → g1": "g0-old → g1 (extended class)", "g1 → g2": "g1 → g2 (new architecture)"}
SERVING_LABELS = {"g1": "g1 (50 % of items, most uncertain first)",
                  "g2": "g2 (50 % of shards, the generation it searches worst first)"}
METRIC_LABELS = {"cmc@1": "CMC@1", "cmc@5": "CMC@5", "map": "mAP"}
BLOCK = re.compile(r"(<!-- readme-table:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /readme-table:(?P=name) -->)", re.S)


def _value(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def updates_table(compatibility: dict) -> str:
    """Per update and metric (CMC@1, mAP): the new model's own retrieval, new queries against the
    old gallery, the old model's own, backfill saved at 0 % re-embedded ((cross − old self) /
    (new self − old self); n/a where the new model gains less than a point), P_com (hbct.md §11;
    n/a where φ* is too weak to normalise by) and the empirical criterion cross > old self."""
    rows = []
    for update, summaries in compatibility["updates"].items():
        for metric in ("cmc@1", "map"):
            s = summaries[metric]
            rows.append([UPDATE_LABELS.get(update, update), METRIC_LABELS[metric], _value(s["self"]), _value(s["cross"]),
                         _value(s["old_self"]), _value(s["backfill_saved"], 2), _value(s["p_com"], 2),
                         "passes" if s["compatible"] else "fails"])
    return _table(["update", "metric", "new self", "cross (new → old gallery)", "old self", "backfill saved at 0 %",
                   "P_com", "criterion"], rows)


def map_matrix_table(compatibility: dict) -> str:
    """mAP of every query generation (rows) against every gallery generation (columns) it may search."""
    names, matrix = compatibility["generations"], compatibility["matrices"]["map"]
    rows = [[f"**{query}**", *(_value(v) if v is not None else "·" for v in matrix[i])] for i, query in enumerate(names)]
    return _table(["mAP: queries ↓ gallery →", *names], rows)


def served_table(gallery: list[dict]) -> str:
    """The served gallery after each deployment: which generation holds how many items, the mAP
    before the update, as ``orchestrator search`` returns it, and after a full backfill."""
    rows = []
    for row in gallery:
        holds = ", ".join(part.replace("=", ": ") for part in row["items by generation"].split())
        before = "—" if not row["same-generation"] else f"{row['same-generation']}: {_value(row['same-generation map'])}"
        rows.append([SERVING_LABELS.get(row["serving"], row["serving"]), holds, before, _value(row["search map"]),
                     _value(row["full map"])])
    return _table(["serving", "gallery holds", "same generation (before the update)", "mAP as served (search)",
                   "mAP after a full backfill"], rows)


def backfill_table(curves: dict[str, list[tuple[float, float]]], gallery: list[dict]) -> str:
    """Each deployment's backfilling curve: the served mAP against the fraction re-embedded, and
    under it the share of the full backfill's gain it has recovered (backfill saved)."""
    fractions = [f for f, _ in next(iter(curves.values()))]
    saved = {row["serving"]: row.get("curve backfill saved (map)") for row in gallery}
    rows = []
    for generation, points in curves.items():
        rows.append([generation, *(_value(m) for _, m in points)])
        if saved.get(generation):
            rows.append([f"{generation}: backfill saved", *(_value(v, 2) for _, v in saved[generation])])
    return _table(["re-embedded", *(f"{round(100 * f)} %" for f in fractions)], rows)


def tables(reports: Path, gallery: str = GALLERY) -> dict[str, str]:
    """Table name → Markdown, from the report folder of one run."""
    compatibility = json.loads((reports / "compatibility.json").read_text(encoding="utf-8"))
    served = json.loads((reports / f"gallery-{gallery}.json").read_text(encoding="utf-8"))
    curves = {}
    for path in sorted(reports.glob(f"backfill-{gallery}-*.csv")):
        with path.open(newline="", encoding="utf-8") as file:
            curves[path.stem.removeprefix(f"backfill-{gallery}-")] = [(float(r["fraction"]), float(r["map"]))
                                                                      for r in csv.DictReader(file)]
    return {"updates": updates_table(compatibility), "map-matrix": map_matrix_table(compatibility),
            "served": served_table(served), "backfill": backfill_table(curves, served)}


def rewrite(text: str, generated: dict[str, str]) -> str:
    """``text`` with every marked block replaced by its generated table (an unknown name is an error)."""
    def replace(match: re.Match) -> str:
        name = match.group("name")
        if name not in generated:
            raise ValueError(f"README block {name!r}: no such table (tables: {', '.join(generated)})")
        return match.group(1) + generated[name] + match.group(4)

    return BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The README's result tables from a run's report files.")
    parser.add_argument("reports", type=Path, help="the run's report folder, e.g. runs/lifelong/reports")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--write", type=Path, metavar="README", help="replace the marked tables in this file")
    target.add_argument("--check", type=Path, metavar="README", help="exit 1 when this file's tables differ")
    args = parser.parse_args(argv)
    generated = tables(args.reports)
    if args.write is None and args.check is None:
        print("\n".join(f"{name}:\n{table}" for name, table in generated.items()))
        return 0
    path = args.write or args.check
    text = path.read_text(encoding="utf-8")
    new = rewrite(text, generated)
    if args.write is not None:
        path.write_text(new, encoding="utf-8")
        return 0
    if new != text:
        print(f"{path}: its tables differ from {args.reports} (run with --write to update them)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
