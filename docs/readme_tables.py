"""The README's result tables, generated from the report files of default runs over several seeds.

    python3 -m orchestrator run pipelines/lifelong.yaml                 # writes runs/lifelong/reports/
    python3 docs/readme_tables.py runs/lifelong/reports --check          # is this run inside the README's spread?
    python3 docs/readme_tables.py SEED_REPORTS... --write README.md      # the tables: mean ± sd over the seeds
    python3 docs/readme_tables.py SEED_REPORTS... --same README.md       # exit 1 when the tables differ

A run on another CPU follows another floating-point path and differs from a run here the way
another seed does, so the README shows each number as the mean ± the standard deviation over the
stored seeds' runs (``tests/docs/readme_reports/seed-*``: the report files of
``orchestrator run pipelines/lifelong.yaml --set generations.<i>.training.seed=<s>``), and
``--check`` accepts a run whose every number lies in the seeds' prediction interval

    mean ± t_{(1+c)/2, n−1} · sd · √(1 + 1/n)      (c = ``CONFIDENCE``; n seeds)

widened by half a unit of the digit the table prints, for every number of the update, matrix and
served tables (``CHECKED``). Words and n/a are not judged: they follow from numbers that are.

Each table sits in README.md between ``<!-- readme-table:NAME -->`` and ``<!-- /readme-table:NAME -->``
and is made from ``compatibility.json`` (the compatibility matrices and the update summaries),
``gallery-<gallery>.json`` (the served gallery after each deployment) and
``backfill-<gallery>-<generation>.csv`` (the backfilling curves) of each run;
``tests/docs/test_readme_tables.py`` checks that the README's tables are exactly what this script
makes of the stored seeds. Standard library only: it runs without the package's dependencies.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

GALLERY = "digits-test"
SEED_REPORTS = Path(__file__).resolve().parents[1] / "tests" / "docs" / "readme_reports"
#: Per number, the probability that a run of the same code (another seed, another CPU) falls in its interval.
CONFIDENCE = 0.99
#: The tables ``--check`` judges; the backfilling curves' points are not (the served table holds
#: their 50 % point), their neighbours move together and a seed's whole curve can sit apart.
CHECKED = ("updates", "map-matrix", "served")
#: Student's t quantile t_{0.995, df} for c = 0.99 (df ≥ 11 uses df = 10's, which is wider than the true one).
T_995 = {1: 63.657, 2: 9.925, 3: 5.841, 4: 4.604, 5: 4.032, 6: 3.707, 7: 3.499, 8: 3.355, 9: 3.250, 10: 3.169}
#: How the README names the updates and the deployments of ``pipelines/lifelong.yaml``.
UPDATE_LABELS = {"g0-old → g1": "g0-old → g1 (extended class)", "g1 → g2": "g1 → g2 (new architecture)"}
SERVING_LABELS = {"g1": "g1 (50 % of items, most uncertain first)",
                  "g2": "g2 (50 % of shards, the generation it searches worst first)"}
METRIC_LABELS = {"cmc@1": "CMC@1", "cmc@5": "CMC@5", "map": "mAP"}
BLOCK = re.compile(r"(<!-- readme-table:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /readme-table:(?P=name) -->)", re.S)


class Number(NamedTuple):
    """A measured value printed with ``digits`` decimals (None: n/a in that run)."""

    value: float | None
    digits: int = 3


Cell = Number | str
#: One table of one run: its header and its rows (first cell the row's label).
Table = tuple[list[str], list[list[Cell]]]


def updates_table(compatibility: dict) -> Table:
    """Per update and metric (CMC@1, mAP): the new model's own retrieval, new queries against the
    old gallery, the old model's own, backfill saved at 0 % re-embedded ((cross − old self) /
    (new self − old self); n/a where the new model gains less than a point), P_com (hbct.md §11;
    n/a where φ* is too weak to normalise by) and the empirical criterion cross > old self."""
    rows: list[list[Cell]] = []
    for update, summaries in compatibility["updates"].items():
        for metric in ("cmc@1", "map"):
            s = summaries[metric]
            rows.append([f"{UPDATE_LABELS.get(update, update)} | {METRIC_LABELS[metric]}", Number(s["self"]),
                         Number(s["cross"]), Number(s["old_self"]), Number(s["backfill_saved"], 2),
                         Number(s["p_com"], 2), "passes" if s["compatible"] else "fails"])
    return (["update | metric", "new self", "cross (new → old gallery)", "old self", "backfill saved at 0 %",
             "P_com", "criterion"], rows)


def map_matrix_table(compatibility: dict) -> Table:
    """mAP of every query generation (rows) against every gallery generation (columns) it may search."""
    names, matrix = compatibility["generations"], compatibility["matrices"]["map"]
    rows: list[list[Cell]] = [[f"**{query}**", *(Number(v) if v is not None else "·" for v in matrix[i])]
                              for i, query in enumerate(names)]
    return (["mAP: queries ↓ gallery →", *names], rows)


def served_table(gallery: list[dict]) -> Table:
    """The served gallery after each deployment: which generation holds how many items, the mAP
    before the update, as ``orchestrator search`` returns it, and after a full backfill."""
    rows: list[list[Cell]] = []
    for row in gallery:
        holds = ", ".join(part.replace("=", ": ") for part in row["items by generation"].split())
        before: Cell = Number(row["same-generation map"]) if row["same-generation"] else "—"
        rows.append([SERVING_LABELS.get(row["serving"], row["serving"]), holds, row["same-generation"] or "—", before,
                     Number(row["search map"]), Number(row["full map"])])
    return (["serving", "gallery holds", "same generation (before the update)", "its mAP", "mAP as served (search)",
             "mAP after a full backfill"], rows)


def backfill_table(curves: dict[str, list[tuple[float, float]]], gallery: list[dict]) -> Table:
    """Each deployment's backfilling curve: the served mAP against the fraction re-embedded, and
    under it the share of the full backfill's gain it has recovered (backfill saved)."""
    fractions = [f for f, _ in next(iter(curves.values()))]
    saved = {row["serving"]: row.get("curve backfill saved (map)") for row in gallery}
    rows: list[list[Cell]] = []
    for generation, points in curves.items():
        rows.append([generation, *(Number(m) for _, m in points)])
        if saved.get(generation):
            rows.append([f"{generation}: backfill saved", *(Number(v, 2) for _, v in saved[generation])])
    return (["re-embedded", *(f"{round(100 * f)} %" for f in fractions)], rows)


def run_tables(reports: Path, gallery: str = GALLERY) -> dict[str, Table]:
    """Table name → its cells, from the report folder of one run."""
    compatibility = json.loads((reports / "compatibility.json").read_text(encoding="utf-8"))
    served = json.loads((reports / f"gallery-{gallery}.json").read_text(encoding="utf-8"))
    curves = {}
    for path in sorted(reports.glob(f"backfill-{gallery}-*.csv")):
        with path.open(newline="", encoding="utf-8") as file:
            curves[path.stem.removeprefix(f"backfill-{gallery}-")] = [(float(r["fraction"]), float(r["map"]))
                                                                      for r in csv.DictReader(file)]
    return {"updates": updates_table(compatibility), "map-matrix": map_matrix_table(compatibility),
            "served": served_table(served), "backfill": backfill_table(curves, served)}


def _aligned(runs: list[dict[str, Table]]) -> dict[str, tuple[list[str], list[list[list[Cell]]]]]:
    """Table name → (header, rows of cells, each cell the list of the runs' cells). Every run must
    have the same tables, rows and columns: they are runs of one pipeline file."""
    first = runs[0]
    aligned = {}
    for name, (header, rows) in first.items():
        for run in runs[1:]:
            other_header, other_rows = run[name]
            labels = [row[0] for row in rows]
            if other_header != header or [row[0] for row in other_rows] != labels:
                raise ValueError(f"table {name!r}: the runs differ in their rows or columns ({labels} against "
                                 f"{[row[0] for row in other_rows]}): they are not runs of one pipeline file")
        aligned[name] = (header, [[[run[name][1][r][c] for run in runs] for c in range(len(row))]
                                  for r, row in enumerate(rows)])
    return aligned


def _spread(cells: list[Cell]) -> str:
    """The README's cell for one number over the runs: mean ± sd (n/a where every run had none;
    the count where only some had one); a word with how many runs gave it where they disagree."""
    if all(isinstance(c, str) for c in cells):
        words = list(dict.fromkeys(cells))
        if len(words) == 1:
            return words[0] if words[0] not in ("passes", "fails") else f"{words[0]} ({len(cells)} of {len(cells)})"
        return ", ".join(f"{w} ({cells.count(w)} of {len(cells)})" for w in words)
    numbers = [c for c in cells if isinstance(c, Number)]
    if len(numbers) != len(cells):
        raise ValueError(f"a cell is a number in some runs and a word in others: {cells}")
    values = [n.value for n in numbers if n.value is not None]
    digits = numbers[0].digits
    if not values:
        return "n/a"
    text = f"{statistics.fmean(values):.{digits}f}"
    if len(values) > 1:
        text += f" ± {statistics.stdev(values):.{digits}f}"
    return text if len(values) == len(cells) else f"{text} (n/a in {len(cells) - len(values)} of {len(cells)})"


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(" | ".join(header).split(" | "))]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def tables(seed_reports: list[Path], gallery: str = GALLERY) -> dict[str, str]:
    """Table name → Markdown: each number the mean ± sd over the runs in ``seed_reports``."""
    aligned = _aligned([run_tables(path, gallery) for path in seed_reports])
    return {name: _markdown(header, [[_spread(cells) for cells in row] for row in rows])
            for name, (header, rows) in aligned.items()}


def interval(values: list[float], digits: int) -> tuple[float, float]:
    """The prediction interval of one more run (module docstring) from the seeds' ``values`` (≥ 2)."""
    n = len(values)
    half = T_995[min(n - 1, max(T_995))] * statistics.stdev(values) * math.sqrt(1 + 1 / n) + 0.5 * 10 ** -digits
    mean = statistics.fmean(values)
    return mean - half, mean + half


def outside(run: dict[str, Table], seeds: list[dict[str, Table]]) -> list[str]:
    """One line for every number of ``run``'s CHECKED tables outside the seeds' interval (module
    docstring). Words and n/a are not judged: each follows from numbers that are (a criterion from
    cross and old self, an n/a from a denominator under its threshold)."""
    problems = []
    for name, (header, rows) in _aligned([run, *seeds]).items():
        if name not in CHECKED:
            continue
        columns = " | ".join(header).split(" | ")
        for row in rows:
            label = str(row[0][0])
            for column, cells in zip(columns[len(label.split(" | ")):], row[1:]):
                mine = cells[0]
                values = [c.value for c in cells[1:] if isinstance(c, Number) and c.value is not None]
                if not isinstance(mine, Number) or mine.value is None or len(values) < 2:
                    continue
                low, high = interval(values, mine.digits)
                if not low <= mine.value <= high:
                    problems.append(f"{name}: {label}, {column}: {mine.value:.{mine.digits}f} outside "
                                    f"[{low:.{mine.digits}f}, {high:.{mine.digits}f}] (the {len(values)} seeds' "
                                    f"{CONFIDENCE:.0%} interval)")
    return problems


def rewrite(text: str, generated: dict[str, str]) -> str:
    """``text`` with every marked block replaced by its generated table (an unknown name is an error)."""
    def replace(match: re.Match) -> str:
        name = match.group("name")
        if name not in generated:
            raise ValueError(f"README block {name!r}: no such table (tables: {', '.join(generated)})")
        return match.group(1) + generated[name] + match.group(4)

    return BLOCK.sub(replace, text)


def stored_seeds(folder: Path = SEED_REPORTS) -> list[Path]:
    """The stored seeds' report folders, in order (``seed-<n>``)."""
    found = sorted(folder.glob("seed-*"), key=lambda p: int(p.name.removeprefix("seed-")))
    if len(found) < 2:
        raise ValueError(f"{folder}: {len(found)} seed report folder(s) (seed-<n>); the spread needs at least 2")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The README's result tables from default runs' report files.")
    parser.add_argument("reports", type=Path, nargs="+",
                        help="report folders, e.g. runs/lifelong/reports (one run with --check, the seeds otherwise)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true",
                        help="exit 1 when a number of the run lies outside the stored seeds' interval")
    action.add_argument("--write", type=Path, metavar="README", help="replace the marked tables in this file")
    action.add_argument("--same", type=Path, metavar="README", help="exit 1 when this file's tables differ")
    parser.add_argument("--seeds", type=Path, default=SEED_REPORTS,
                        help=f"with --check: the folder of the seeds' report folders (default {SEED_REPORTS})")
    args = parser.parse_args(argv)
    if args.check:
        if len(args.reports) != 1:
            parser.error("--check takes one run's report folder")
        seeds = stored_seeds(args.seeds)
        problems = outside(run_tables(args.reports[0]), [run_tables(path) for path in seeds])
        for line in problems:
            print(f"{args.reports[0]}: {line}", file=sys.stderr)
        print(f"{args.reports[0]}: {'outside' if problems else 'inside'} the spread of {len(seeds)} seeds "
              f"({len(problems)} number(s) outside)")
        return 1 if problems else 0
    generated = tables(args.reports)
    if args.write is None and args.same is None:
        print("\n".join(f"{name}:\n{table}" for name, table in generated.items()))
        return 0
    path = args.write or args.same
    text = path.read_text(encoding="utf-8")
    new = rewrite(text, generated)
    if args.write is not None:
        path.write_text(new, encoding="utf-8")
        return 0
    if new != text:
        print(f"{path}: its tables differ from those of {len(args.reports)} run(s) (run with --write to update them)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
