"""Compatibility of every method on two datasets at several training budgets (issue 14).

For each (dataset, epochs) pair, ``run_update_experiment`` trains every method's old model φ_o on
the first half of the classes, its unaligned reference φ_* and its new model φ_n on all classes,
and evaluates them on the held-out split. One markdown table per pair: old self, new self, cross,
P_com, P_up (CMC@1 / mAP) and the empirical criterion, followed by the papers' orderings, each
stated as holding or not on that table.

Datasets: ``digits`` (scikit-learn's, the project's default), ``shapes`` (generated offline,
test split on held-out background styles; by default the 24-class, 24x24 variant below, sized for
2 CPU cores) and ``shapes-60`` (60 classes, 36,000 training images at 32x32: the many-class,
short-budget regime of issue 14's held-out check). After the per-seed tables of a (dataset, budget),
a summary counts the seeds in which each HBCT row meets issue 14's targets (``targets``).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from orchestrator.data import load_shapes
from orchestrator.evaluation.update_experiment import ExperimentSettings, UpdateExperiment, run_update_experiment
from orchestrator.metrics import KEY_METRICS, update_summary
from orchestrator.training.config import TrainConfig

#: The ``shapes`` options the benchmark uses (24 classes, 2,880 training images, 24x24).
SHAPES_OPTIONS: dict[str, Any] = {"num_shapes": 6, "num_patterns": 4, "train_per_class": 120,
                                  "test_per_class": 20, "image_size": 24}
#: ``shapes-60``: the regime of issue 14's held-out check (62 classes of 32x32 RGB, 37,200 training
#: images, 4 epochs): 60 classes (10 shapes x 6 patterns), 600 training images per class, 32x32.
SHAPES_60_OPTIONS: dict[str, Any] = {"num_shapes": 10, "num_patterns": 6, "train_per_class": 600,
                                     "test_per_class": 20, "image_size": 32}
#: Per shapes variant: (its ``load_shapes`` options, batch size, embed_dim).
_SHAPES_RECIPES: dict[str, tuple[dict[str, Any], int, int]] = {"shapes": (SHAPES_OPTIONS, 64, 32),
                                                               "shapes-60": (SHAPES_60_OPTIONS, 128, 64)}
#: A row: (label, method, params) or (label, method, params, old_params), old_params set on the old
#: model alone (``run_update_experiment``).
Row = tuple[str, str, dict[str, Any]] | tuple[str, str, dict[str, Any], dict[str, Any]]
#: The paper's HBCT: its fixed logit scale (``HBCTParams`` learn it by default since round 5; the
#: ceiling 100 keeps these rows' derived training seeds, and so their models, those of rounds 1-4).
PAPER_HBCT: dict[str, Any] = {"mlr_learn_scale": False, "mlr_max_scale": 100.0}


def _paper(**fields: Any) -> dict[str, Any]:
    """The paper's HBCT parameters with ``fields`` over them (a candidate recipe of rounds 1-4)."""
    return {**PAPER_HBCT, **fields}


#: HBCT (its defaults: round 4's ``hbct t≤1.5 old-t≤3``, trained to the digit alike), the paper's
#: HBCT, the candidate recipes of issue 14 (s: MLR init scale, t: learned logit scale, t≤m: capped
#: at m, w: λ warm-up fraction, old-t: the learned scale on the old model only, old-t≤m: capped at
#: m), the cosine methods.
METHODS: tuple[Row, ...] = (
    ("hbct", "hbct", {}),
    ("hbct paper", "hbct", _paper()),
    ("hbct s10 λ1", "hbct", _paper(mlr_init_scale=10.0, lam=1.0)),
    ("hbct t", "hbct", _paper(mlr_learn_scale=True)),
    ("hbct old-t", "hbct", _paper(), {"mlr_learn_scale": True}),
    ("hbct old-t≤3", "hbct", _paper(), {"mlr_learn_scale": True, "mlr_max_scale": 3.0}),
    ("hbct old-t≤5", "hbct", _paper(), {"mlr_learn_scale": True, "mlr_max_scale": 5.0}),
    ("hbct s2 old-t≤3", "hbct", _paper(mlr_init_scale=2.0),
     {"mlr_init_scale": 1.0, "mlr_learn_scale": True, "mlr_max_scale": 3.0}),
    ("hbct s3 old-t≤3", "hbct", _paper(mlr_init_scale=3.0),
     {"mlr_init_scale": 1.0, "mlr_learn_scale": True, "mlr_max_scale": 3.0}),
    ("hbct t≤2 old-t≤3", "hbct", {"mlr_max_scale": 2.0}),
    ("hbct t λ0.6", "hbct", _paper(mlr_learn_scale=True, lam=0.6)),
    ("hbct t≤3", "hbct", _paper(mlr_learn_scale=True, mlr_max_scale=3.0)),
    ("hbct t≤3 λ0.6", "hbct", _paper(mlr_learn_scale=True, mlr_max_scale=3.0, lam=0.6)),
    ("hbct t≤3 λ1", "hbct", _paper(mlr_learn_scale=True, mlr_max_scale=3.0, lam=1.0)),
    ("hbct t λ1", "hbct", _paper(mlr_learn_scale=True, lam=1.0)),
    ("hbct t λ1 w0.5", "hbct", _paper(mlr_learn_scale=True, lam=1.0, lam_warmup=0.5)),
    ("hbct s10 λ1 w0.5", "hbct", _paper(mlr_init_scale=10.0, lam=1.0, lam_warmup=0.5)),
    ("hbct s10 t λ1", "hbct", _paper(mlr_init_scale=10.0, mlr_learn_scale=True, lam=1.0)),
    ("bct", "bct", {}),
    ("lce", "lce", {}),
    ("hot_refresh", "hot_refresh", {}),
    ("l2", "l2", {}),
    ("lambda_orth", "lambda_orth", {}),
    ("fct", "fct", {}),
)
_COLUMNS = ("old self", "ref self", "self", "cross", "P_com", "P_up")
_KEYS = ("old_self", "reference_self", "self", "cross", "p_com", "p_up")


def experiment_for(dataset: str, epochs: int, seed: int = 0, test_per_class: int | None = None) -> UpdateExperiment:
    """The update experiment of ``dataset`` at ``epochs``, base seed ``seed``:

    "digits" and "shapes": batch 64, SGD lr 0.05, no augmentation, embed_dim 32, test_resnet (the
    default pipeline's recipe); "shapes-60": ``SHAPES_60_OPTIONS`` with the recipe of issue 14's
    held-out check (batch 128, SGD lr 0.05, embed_dim 64, test_resnet; it trained 4 epochs).
    ``test_per_class`` sets the size of a shapes variant's held-out split (None: its options' 20;
    a larger split measures each trained model with less sampling noise)."""
    if dataset == "digits":
        training = TrainConfig(epochs=epochs, batch_size=64, lr=0.05, augment=False, seed=seed)
        return UpdateExperiment(ExperimentSettings(embed_dim=32, training=training))
    if dataset in _SHAPES_RECIPES:
        shapes_options, batch_size, embed_dim = _SHAPES_RECIPES[dataset]
        options = dict(shapes_options)
        if test_per_class is not None:
            options["test_per_class"] = test_per_class
        size = options.pop("image_size")
        training = TrainConfig(epochs=epochs, batch_size=batch_size, lr=0.05, augment=False, seed=seed)
        settings = ExperimentSettings(embed_dim=embed_dim, training=training, image_size=size)
        return UpdateExperiment(settings, load_shapes("train", image_size=size, **options),
                                load_shapes("test", image_size=size, **options))
    raise ValueError(f"dataset: expected 'digits', 'shapes' or 'shapes-60', got {dataset!r}")


def measure(dataset: str, epochs: int, methods: Sequence[Row] = METHODS,
            workers: int = 2, seed: int = 0, test_per_class: int | None = None) -> list[dict[str, Any]]:
    """One row per method: its label and, per key metric (``KEY_METRICS``: CMC@1, mAP), the update summary with
    ``old_self`` added (the old model's self-test)."""
    result = run_update_experiment([row[1:] for row in methods],
                                   experiment=experiment_for(dataset, epochs, seed, test_per_class), workers=workers)
    rows = []
    for (label, *_), generation in zip(methods, result.generations):
        old, _ = result.generations[generation]
        per_metric = {}
        for metric in KEY_METRICS:
            summary = dict(result.summaries[generation][metric])
            summary["old_self"] = result.report.value(old, old, metric)
            per_metric[metric] = summary
        rows.append({"method": label, **per_metric})
    return rows


def _defined(value: Any) -> bool:
    """False for a missing or NaN value (an undefined P_com / P_up)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _cell(value: Any, signed: bool = False) -> str:
    if not _defined(value):
        return "–"
    return f"{value:+.2f}" if signed else f"{value:.3f}"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per method, each column "CMC@1 / mAP", then the criterion per metric."""
    header = "| method | " + " | ".join(_COLUMNS) + " | criterion (CMC@1 / mAP) |"
    lines = [header, "|" + "---|" * (len(_COLUMNS) + 2)]
    for row in rows:
        cells = []
        for key in _KEYS:
            signed = key.startswith("p_")
            cells.append(f"{_cell(row['cmc@1'].get(key), signed)} / {_cell(row['map'].get(key), signed)}")
        verdict = " / ".join("passes" if row[m]["compatible"] else "fails" for m in KEY_METRICS)
        lines.append(f"| {row['method']} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines)


def orderings(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The papers' claims checked on one table, each "holds" / "does not hold" with its numbers:
    every HBCT row's P_com ≥ BCT's (HBCT Table 1), LCE's P_com ≥ BCT's (LCE), BCT passes the
    criterion (BCT). A comparison with an undefined P_com is "not comparable"; a claim whose
    methods are missing from ``rows`` is left out."""
    by = {row["method"]: row for row in rows}
    hbct = [label for label in by if label.startswith("hbct")]
    out = []
    for better, metric in [(h, m) for h in hbct for m in KEY_METRICS] + [("lce", "map")]:
        if better in by and "bct" in by:
            a, b = by[better][metric]["p_com"], by["bct"][metric]["p_com"]
            if not (_defined(a) and _defined(b)):
                verdict = "not comparable (a P_com is undefined: its reference is not above the old model)"
            else:
                verdict = "holds" if a >= b else "does not hold"
            out.append(f"P_com {metric}: {better} ≥ bct ({_cell(a, True)} vs {_cell(b, True)}): {verdict}")
    if "bct" in by:
        passes = all(by["bct"][m]["compatible"] for m in KEY_METRICS)
        out.append("bct passes the empirical criterion on CMC@1 and mAP: " + ("holds" if passes else "does not hold"))
    return out


#: Issue 14's targets, per seed, for an HBCT row against the same table's ``bct`` row.
TARGETS = ("criterion", "p_up", "old", "p_com")
#: How far below a target a value may fall and still meet it (issue 14: P_up ≥ −0.05, the old model
#: within 0.05 mAP of the cosine one, P_com ≥ BCT's − 0.05).
TARGET_SLACK = 0.05


def targets(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, bool]]:
    """Issue 14's targets for every HBCT row of one table (one dataset, budget and seed):

    criterion: the empirical criterion passes on CMC@1 and on mAP;
    p_up:      P_up ≥ −0.05 on CMC@1 and on mAP;
    old:       the HBCT old model's mAP ≥ the cosine old model's (``bct``'s old self) − 0.05;
    p_com:     P_com (mAP) ≥ BCT's P_com (mAP) − 0.05; an undefined P_com, on either side (its
               φ_* not ``MIN_NORMALISER`` above its old model), does not meet it.
    Rows of a table without ``bct`` have no ``old`` / ``p_com`` verdict (both False)."""
    by = {row["method"]: row for row in rows}
    bct = by.get("bct")
    out = {}
    for label, row in by.items():
        if not label.startswith("hbct"):
            continue
        p_com, bct_p_com = row["map"].get("p_com"), (bct["map"].get("p_com") if bct else None)
        out[label] = {
            "criterion": all(row[m]["compatible"] for m in KEY_METRICS),
            "p_up": all(_defined(row[m].get("p_up")) and row[m]["p_up"] >= -TARGET_SLACK for m in KEY_METRICS),
            "old": bct is not None and row["map"]["old_self"] >= bct["map"]["old_self"] - TARGET_SLACK,
            "p_com": _defined(p_com) and _defined(bct_p_com) and p_com >= bct_p_com - TARGET_SLACK,
        }
    return out


def seed_means(tables: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The mean update of every row of ``tables`` (one per seed, same dataset and budget), a row as
    ``measure`` returns it: per key metric, ``update_summary`` of the seed means of the old model's,
    φ_*'s and the new model's self-tests and of the cross-test (so P_com and P_up are ratios of
    means, defined whenever the mean φ_* beats the mean old model by ``MIN_NORMALISER``)."""
    labels = list(dict.fromkeys(row["method"] for table in tables for row in table))
    out = []
    for label in labels:
        found = [row for table in tables for row in table if row["method"] == label]
        per_metric = {}
        for metric in KEY_METRICS:
            mean = {key: statistics.fmean(row[metric][key] for row in found)
                    for key in ("self", "cross", "old_self", "reference_self")}
            per_metric[metric] = {**update_summary(mean["self"], mean["cross"], mean["old_self"],
                                                   mean["reference_self"]),
                                  "reference_self": mean["reference_self"]}
        out.append({"method": label, **per_metric})
    return out


def format_summary(tables: Sequence[Sequence[dict[str, Any]]]) -> str:
    """Markdown: per HBCT row of ``tables`` (one per seed, same dataset and budget), the seeds meeting
    all of issue 14's targets and each one (P_com also counts its undefined seeds), the targets the
    mean update (``seed_means``) misses, then the seed means of old self / self / cross mAP;
    ``bct``'s means in the last row."""
    header = ("| variant | seeds | all targets | criterion | P_up ≥ −0.05 | old within 0.05 | "
              "P_com ≥ BCT − 0.05 (undefined) | seed means miss | mean old mAP | mean self mAP | mean cross mAP |")
    lines = [header, "|" + "---|" * 11]
    mean_rows = seed_means(tables)
    verdicts_per_table = [targets(table) for table in tables]
    of_the_means = targets(mean_rows)
    for mean_row in mean_rows:
        label = mean_row["method"]
        found = [(row, verdicts.get(label)) for table, verdicts in zip(tables, verdicts_per_table)
                 for row in table if row["method"] == label]
        means = " | ".join(f"{mean_row['map'][key]:.3f}" for key in ("old_self", "self", "cross"))
        if found[0][1] is None:
            lines.append(f"| {label} | {len(found)} | – | – | – | – | – | – | {means} |")
            continue
        met = {name: sum(verdicts[name] for _, verdicts in found) for name in TARGETS}
        every = sum(all(verdicts.values()) for _, verdicts in found)
        undefined = sum(not _defined(row["map"].get("p_com")) for row, _ in found)
        missed = ", ".join(name for name in TARGETS if not of_the_means[label][name]) or "none"
        lines.append(f"| {label} | {len(found)} | {every} | {met['criterion']} | {met['p_up']} | {met['old']} | "
                     f"{met['p_com']} ({undefined}) | {missed} | {means} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="digits,shapes")
    parser.add_argument("--epochs", default="10,20", help="comma-separated training budgets")
    parser.add_argument("--methods", default=",".join(row[0] for row in METHODS),
                        help="comma-separated labels of METHODS")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", default="0", help="comma-separated base training seeds (one table each)")
    parser.add_argument("--out", type=Path, default=None, help="append each table to this markdown file")
    parser.add_argument("--test-per-class", type=int, default=None,
                        help="held-out images per class of a shapes variant (default: its options' 20)")
    args = parser.parse_args(argv)
    known = {row[0]: row for row in METHODS}
    unknown = [m for m in args.methods.split(",") if m not in known]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; known: {', '.join(known)}")
    methods = [known[m] for m in args.methods.split(",")]

    def emit(text: str) -> None:
        print(text, flush=True)
        if args.out is not None:
            with open(args.out, "a", encoding="utf-8") as handle:
                handle.write(text + "\n")

    seeds = [int(s) for s in args.seeds.split(",")]
    for dataset in args.datasets.split(","):
        for epochs in (int(e) for e in args.epochs.split(",")):
            tables = []
            for seed in seeds:
                started = time.perf_counter()
                rows = measure(dataset, epochs, methods, args.workers, seed, args.test_per_class)
                tables.append(rows)
                emit(f"### {dataset}, {epochs} epochs, seed {seed} ({time.perf_counter() - started:.0f} s)\n\n"
                     + format_table(rows) + "\n\n" + "\n".join(f"- {line}" for line in orderings(rows)) + "\n")
            emit(f"### {dataset}, {epochs} epochs: issue 14's targets over seeds {args.seeds}\n\n"
                 + format_summary(tables) + "\n\nThe mean update (seed means of every self- and cross-test):\n\n"
                 + format_table(seed_means(tables)) + "\n")
    return 0
