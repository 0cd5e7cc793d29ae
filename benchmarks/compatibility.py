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
the report gives issue 28's verdict per method on the mean update (``method_targets``: the
criterion for every method, P_up ≥ −0.05 for the aligned ones), the seeds in which each HBCT row
meets issue 14's targets (``targets``) and the mean update's table.

Issue 28 added: every registered method as the default rows (``DEFAULT_METHODS``); ``--device``;
``--jobs`` (tables measured at once, one process each); ``--rows-out`` / ``--from-rows`` (store each
table's rows as a JSON line, report stored tables without training); ``--by-class-age`` (every
update measured again on the classes the old model saw and on the others); rows that fine-tune
the new model from its old model.

Issue 39 added ``--upgrade cross-arch`` (``benchmarks/cross_arch.py``): the old and the new encoder of
two architectures (``--new-arch``) trained independently, each post-hoc map fitted on the same
pairs against λ-orthogonality and FCT; ``--from-rows`` then prints (``--readme``: rewrites) the
README section of the stored records.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Sequence

if __package__ in (None, ""):  # run as `python benchmarks/compatibility.py`: the checkout on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from benchmarks import cross_arch
from benchmarks.harness import rewrite_section
from orchestrator.data import LabeledImages, load_shapes
from orchestrator.evaluation import CompatibilityReport, evaluate_generations
from orchestrator.evaluation.update_experiment import ExperimentSettings, UpdateExperiment, run_update_experiment
from orchestrator.metrics import KEY_METRICS, backfill_saved, update_summary
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
#: A row: (label, method, params), (label, method, params, old_params), old_params set on the old
#: model alone, or (label, method, params, old_params, init_from_parent) (``run_update_experiment``).
Row = (tuple[str, str, dict[str, Any]] | tuple[str, str, dict[str, Any], dict[str, Any]]
       | tuple[str, str, dict[str, Any], dict[str, Any], bool])
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
    ("unibct", "unibct", {}),
    ("advbct", "advbct", {}),
    ("ndpp", "ndpp", {}),
    ("odpp", "odpp", {}),
    ("hoc", "hoc", {}),
    ("dsimplex", "dsimplex", {}),
    ("binary_hyperbolic", "binary_hyperbolic", {}),
    ("independent", "independent", {}),
    # issue 28's candidates and ablations: λ is HOC's and d-Simplex's CE share (1 − λ: InfoNCE to the
    # old model; HOC's default is 0.9 since issue 28, "hoc paper" is the paper's 0.1) and
    # binary_hyperbolic's alignment weight; ft: the new model starts from its old
    # model's weights (the stationary paper's sequential fine-tuning); adv / eb: AdvBCT's
    # adversarial and boundary weights
    ("hoc paper", "hoc", {"lam": 0.1}),
    ("hoc λ0.5", "hoc", {"lam": 0.5}),
    ("hoc λ0.8", "hoc", {"lam": 0.8}),
    ("dsimplex λ0.5", "dsimplex", {"lam": 0.5}),
    ("dsimplex λ0.7", "dsimplex", {"lam": 0.7}),
    ("dsimplex λ0.9", "dsimplex", {"lam": 0.9}),
    ("dsimplex ft", "dsimplex", {}, {}, True),
    ("binary_hyperbolic λ0.1", "binary_hyperbolic", {"lam": 0.1}),
    ("binary_hyperbolic λ0.3", "binary_hyperbolic", {"lam": 0.3}),
    ("advbct adv0.3", "advbct", {"adversarial_weight": 0.3}),
    ("advbct adv0", "advbct", {"adversarial_weight": 0.0}),
    ("advbct eb0", "advbct", {"boundary_weight": 0.0}),
    ("advbct seen", "advbct", {"boundary_classes": "seen"}),
    ("advbct seen adv0.3", "advbct", {"boundary_classes": "seen", "adversarial_weight": 0.3}),
    # NDPP / ODPP on the digits (issue 28): α0 without the perturbation (Eq. 2 alone), λ the weight
    # of Eq. 6, τ its temperature (default: the paper's 0.07)
    ("ndpp α0", "ndpp", {"alpha_old": 0.0, "alpha_new": 0.0}),
    ("ndpp λ2", "ndpp", {"lam": 2.0}),
    ("ndpp τ0.2", "ndpp", {"tau": 0.2}),
    ("ndpp τ0.5", "ndpp", {"tau": 0.5}),
    ("ndpp τ1", "ndpp", {"tau": 1.0}),
    ("odpp λ2", "odpp", {"lam": 2.0}),
    ("odpp τ0.5", "odpp", {"tau": 0.5}),
    ("odpp τ1", "odpp", {"tau": 1.0}),
)
#: The default rows: every registered method that trains its encoder, with its defaults
#: (``independent``: the control, a new model with no alignment at all, held to no target). The
#: post-hoc methods take a given encoder, which an update experiment does not train.
DEFAULT_METHODS: tuple[str, ...] = ("hbct", "bct", "lce", "hot_refresh", "l2", "lambda_orth", "fct", "unibct",
                                    "advbct", "ndpp", "odpp", "hoc", "dsimplex", "binary_hyperbolic", "independent")
_COLUMNS = ("old self", "ref self", "self", "cross", "P_com", "P_up", "backfill saved")
_KEYS = ("old_self", "reference_self", "self", "cross", "p_com", "p_up", "backfill_saved")


def class_count(dataset: str) -> int:
    """C of ``dataset`` as ``experiment_for`` builds it, without generating it: the digits' 10, a
    shapes variant's shapes × patterns."""
    if dataset == "digits":
        return 10
    options = _SHAPES_RECIPES[dataset][0]
    return int(options["num_shapes"] * options["num_patterns"])


def experiment_for(dataset: str, epochs: int, seed: int = 0, test_per_class: int | None = None,
                   device: str = "cpu") -> UpdateExperiment:
    """The update experiment of ``dataset`` at ``epochs``, base seed ``seed``:

    "digits" and "shapes": batch 64, SGD lr 0.05, no augmentation, embed_dim 32, test_resnet (the
    default pipeline's recipe); "shapes-60": ``SHAPES_60_OPTIONS`` with the recipe of issue 14's
    held-out check (batch 128, SGD lr 0.05, embed_dim 64, test_resnet; it trained 4 epochs).
    ``test_per_class`` sets the size of a shapes variant's held-out split (None: its options' 20;
    a larger split measures each trained model with less sampling noise). ``device``: where every
    model trains and is evaluated ("cpu", "cuda")."""
    if dataset == "digits":
        training = TrainConfig(epochs=epochs, batch_size=64, lr=0.05, augment=False, seed=seed)
        return UpdateExperiment(ExperimentSettings(embed_dim=32, training=training), device=device)
    if dataset in _SHAPES_RECIPES:
        shapes_options, batch_size, embed_dim = _SHAPES_RECIPES[dataset]
        size = shapes_options["image_size"]
        training = TrainConfig(epochs=epochs, batch_size=batch_size, lr=0.05, augment=False, seed=seed)
        settings = ExperimentSettings(embed_dim=embed_dim, training=training, image_size=size)
        return UpdateExperiment(settings, _shapes(dataset, "train", test_per_class),
                                _shapes(dataset, "test", test_per_class), device=device)
    raise ValueError(f"dataset: expected 'digits', 'shapes' or 'shapes-60', got {dataset!r}")


@functools.lru_cache(maxsize=4)
def _shapes(dataset: str, split: str, test_per_class: int | None) -> LabeledImages:
    """A shapes variant's split, rendered once per process (every budget and seed measures the same
    images; shapes-60's 36,000 training images take a CPU minute to render)."""
    options = dict(_SHAPES_RECIPES[dataset][0])
    if test_per_class is not None:
        options["test_per_class"] = test_per_class
    return load_shapes(split, image_size=options.pop("image_size"), **options)


def measure(dataset: str, epochs: int, methods: Sequence[Row] = METHODS, workers: int = 2, seed: int = 0,
            test_per_class: int | None = None, device: str = "cpu") -> list[dict[str, Any]]:
    """One row per method: its label and, per key metric (``KEY_METRICS``: CMC@1, mAP), the update summary with
    ``old_self`` added (the old model's self-test)."""
    return measure_experiment(experiment_for(dataset, epochs, seed, test_per_class, device), methods, workers)


def measure_experiment(experiment: UpdateExperiment, methods: Sequence[Row], workers: int,
                       by_class_age: bool = False) -> list[dict[str, Any]]:
    """``measure`` of an experiment built already (``experiment_for``). ``by_class_age``: each row
    also holds, under ``"by_classes"``, its update measured again on the held-out images of the
    classes the old model was trained on (``"seen"``: queries and gallery of those classes alone)
    and of the classes it never saw (``"unseen"``)."""
    result = run_update_experiment([row[1:] for row in methods], experiment=experiment, workers=workers)
    reports = {"all": result.report}
    if by_class_age:
        parents = {label: old for label, (old, _) in result.generations.items()}
        seen = np.isin(experiment.eval_images.labels, experiment.old_classes())
        for part, mask in (("seen", seen), ("unseen", ~seen)):
            images = experiment.eval_images.subset(np.flatnonzero(mask))
            reports[part] = evaluate_generations(result.models, experiment.dataset(images), parents=parents,
                                                 device=experiment.device)
    rows = []
    for (label, *_), generation in zip(methods, result.generations):
        per_part = {part: _update_of(report, *result.generations[generation], generation)
                    for part, report in reports.items()}
        _, reference = result.generations[generation]
        row = {"method": label, **per_part.pop("all"), "train_s": result.train_seconds[generation],
               "reference_train_s": result.train_seconds[reference]}
        if per_part:
            row["by_classes"] = per_part
        rows.append(row)
    return rows


def _update_of(report: CompatibilityReport, old: str, reference: str, new: str) -> dict[str, dict[str, Any]]:
    """Per key metric: the update old → new of ``report`` with φ_* ``reference``, and ``old_self``."""
    return {metric: {**report.compatibility(old, new, reference, metric), "old_self": report.value(old, old, metric)}
            for metric in KEY_METRICS}


def _defined(value: Any) -> bool:
    """False for a missing or NaN value (an undefined P_com / P_up)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _cell(value: Any, signed: bool = False) -> str:
    if not _defined(value):
        return "–"
    return f"{value:+.2f}" if signed else f"{value:.3f}"


def _criterion_cells(row: dict[str, Any]) -> str:
    """"passes / fails": the empirical criterion per key metric (CMC@1 / mAP)."""
    return " / ".join("passes" if row[m]["compatible"] else "fails" for m in KEY_METRICS)


def _p_up_cells(row: dict[str, Any]) -> str:
    """"+0.12 / −0.03": P_up per key metric (CMC@1 / mAP), "–" where undefined."""
    return " / ".join(_cell(row[m].get("p_up"), True) for m in KEY_METRICS)


def _value_of(summary: dict[str, Any], key: str) -> Any:
    if key == "backfill_saved":
        return backfill_saved(summary["cross"], summary["old_self"], summary["self"])
    return summary.get(key)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per method, each column "CMC@1 / mAP", then the criterion per metric.
    Backfill saved at 0 % re-embedded (``metrics.backfill_saved``) is computed from each row's
    self, cross and old self, so rows stored before it was reported show it too."""
    header = "| method | " + " | ".join(_COLUMNS) + " | criterion (CMC@1 / mAP) |"
    lines = [header, "|" + "---|" * (len(_COLUMNS) + 2)]
    for row in rows:
        cells = []
        for key in _KEYS:
            signed = key.startswith("p_") or key == "backfill_saved"
            cmc, mean_ap = (_value_of(row[m], key) for m in KEY_METRICS)
            cells.append(f"{_cell(cmc, signed)} / {_cell(mean_ap, signed)}")
        verdict = _criterion_cells(row)
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
            "criterion": _passes_criterion(row),
            "p_up": _keeps_p_up(row),
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


#: Methods whose new model is not held to P_up ≥ −0.05 (issue 28): ``l2`` pins the new embeddings to
#: the old ones and ``fct`` serves the old model's space through a learned transformation, so both
#: pay for compatibility in the new model's own quality by design (docs/methods.md gives the cost).
UNALIGNED_COST = ("l2", "fct")


def method_targets(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, bool | None]]:
    """Issue 28's targets for every row of one table (usually ``seed_means``' mean update):

    criterion: the empirical criterion passes on CMC@1 and on mAP;
    p_up:      P_up ≥ −0.05 on CMC@1 and on mAP (None for ``UNALIGNED_COST``: not a target)."""
    return {row["method"]: {"criterion": _passes_criterion(row),
                            "p_up": None if row["method"] in UNALIGNED_COST else _keeps_p_up(row)}
            for row in rows}


def _passes_criterion(row: dict[str, Any]) -> bool:
    """The empirical criterion passes on every key metric (CMC@1 and mAP)."""
    return all(row[m]["compatible"] for m in KEY_METRICS)


def _keeps_p_up(row: dict[str, Any]) -> bool:
    """P_up is defined and ≥ −``TARGET_SLACK`` on every key metric."""
    return all(_defined(row[m].get("p_up")) and row[m]["p_up"] >= -TARGET_SLACK for m in KEY_METRICS)


def format_method_targets(tables: Sequence[Sequence[dict[str, Any]]]) -> str:
    """Markdown: per method of ``tables`` (one per seed, same dataset and budget), the seeds passing
    the criterion, then issue 28's verdicts on the mean update (``method_targets``)."""
    mean_rows = seed_means(tables)
    per_seed = [method_targets(table) for table in tables]
    verdicts = method_targets(mean_rows)
    lines = ["| method | seeds passing the criterion | mean update: criterion (CMC@1 / mAP) | "
             "mean P_up (CMC@1 / mAP) | targets met |", "|---|---|---|---|---|"]
    for row in mean_rows:
        label = row["method"]
        passing = sum(v[label]["criterion"] for v in per_seed if label in v)
        seeds = sum(label in v for v in per_seed)
        criterion, p_up = _criterion_cells(row), _p_up_cells(row)
        verdict = verdicts[label]
        met = verdict["criterion"] and verdict["p_up"] is not False
        note = "" if verdict["p_up"] is not None else " (P_up not a target)"
        lines.append(f"| {label} | {passing} / {seeds} | {criterion} | {p_up} | {'yes' if met else 'no'}{note} |")
    return "\n".join(lines)


#: The row every training time is compared with: a new model trained with no alignment at all.
TIME_CONTROL = "independent"


def format_method_costs(tables: Sequence[Sequence[dict[str, Any]]]) -> str:
    """Markdown (docs/methods.md's per-dataset table): per method of ``tables`` (one per seed, same
    dataset and budget), the mean update's mAP self / cross / old self, P_up and the criterion on
    CMC@1 / mAP, and its new model's training time against ``TIME_CONTROL``'s, each seed's ratio
    taken within its own table and the median over seeds reported ("–" where no table holds both
    times; within a table, so seeds measured on different machines compare; the median, so a seed
    trained beside another load does not move it)."""
    def median_ratio(label: str) -> float | None:
        ratios = []
        for table in tables:
            seconds = {row["method"]: row.get("train_s") for row in table}
            if seconds.get(label) is not None and seconds.get(TIME_CONTROL):
                ratios.append(seconds[label] / seconds[TIME_CONTROL])
        return statistics.median(ratios) if ratios else None

    lines = ["| method | mAP self / cross / old | P_up (CMC@1 / mAP) | criterion (CMC@1 / mAP) | training time |",
             "|---|---|---|---|---|"]
    for row in seed_means(tables):
        ratio = median_ratio(row["method"])
        time = f"{ratio:.2f}×" if ratio is not None else "–"
        maps = " / ".join(_cell(row["map"][key]) for key in ("self", "cross", "old_self"))
        p_up, criterion = _p_up_cells(row), _criterion_cells(row)
        lines.append(f"| `{row['method']}` | {maps} | {p_up} | {criterion} | {time} |")
    return "\n".join(lines)


def json_lines(paths: Sequence[Path], what: str, parse: Callable[[dict[str, Any]], Any]) -> list[Any]:
    """``parse`` of every stored record (one JSON object per non-blank line) of ``paths``, in order;
    a line that is not JSON, or that ``parse`` refuses (KeyError, TypeError, ValueError), is an
    error naming its file and line and ``what`` it should have been."""
    parsed = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                parsed.append(parse(json.loads(line)))
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{number}: not {what} ({error})") from None
    return parsed


def read_rows(paths: Sequence[Path]) -> dict[tuple[str, int], list[list[dict[str, Any]]]]:
    """The tables ``--rows-out`` stored (JSON lines), by (dataset, epochs), in the order they came."""
    tables: dict[tuple[str, int], list[list[dict[str, Any]]]] = {}
    for key, rows in json_lines(paths, "a table of --rows-out",
                                lambda record: ((str(record["dataset"]), int(record["epochs"])), record["rows"])):
        tables.setdefault(key, []).append(rows)
    return tables


def report(dataset: str, epochs: int, tables: Sequence[Sequence[dict[str, Any]]], seeds: str) -> str:
    """The text after a (dataset, budget)'s per-seed tables: issue 28's verdicts per method, issue 14's
    HBCT targets, the mean update's table, its per-method costs (``format_method_costs``), and
    (``--by-class-age``) the mean update on the classes the old model saw and on the others."""
    parts = [dict(class_age_tables(table)) for table in tables]
    by_age = "".join(f"\nThe mean update {CLASS_AGES[part]}:\n\n"
                     f"{format_table(seed_means([p[part] for p in parts]))}\n"
                     for part in CLASS_AGES if all(part in p for p in parts))
    return (f"### {dataset}, {epochs} epochs: every method over seeds {seeds}\n\n" + format_method_targets(tables)
            + f"\n\n### {dataset}, {epochs} epochs: issue 14's targets over seeds {seeds}\n\n"
            + format_summary(tables) + "\n\nThe mean update (seed means of every self- and cross-test):\n\n"
            + format_table(seed_means(tables)) + "\n\nPer method, with its training time against "
            + f"``{TIME_CONTROL}``'s:\n\n" + format_method_costs(tables) + "\n" + by_age)


#: ``--by-class-age``'s parts of the held-out split, and how the tables name them.
CLASS_AGES = {"seen": "on the classes the old model was trained on",
              "unseen": "on the classes the old model never saw"}


def class_age_tables(rows: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(part, rows of that part) for each ``CLASS_AGES`` part the rows were measured on."""
    return [(part, [{"method": row["method"], **row["by_classes"][part]} for row in rows])
            for part in CLASS_AGES if rows and all(part in row.get("by_classes", {}) for row in rows)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="digits,shapes")
    parser.add_argument("--epochs", default="10,20", help="comma-separated training budgets")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                        help="comma-separated labels of METHODS (default: every method with its defaults)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seeds", default="0", help="comma-separated base training seeds (one table each)")
    parser.add_argument("--out", type=Path, default=None, help="append each table to this markdown file")
    parser.add_argument("--test-per-class", type=int, default=None,
                        help="held-out images per class of a shapes variant (default: its options' 20)")
    parser.add_argument("--device", default="cpu", help="where models train and are evaluated (cpu, cuda)")
    parser.add_argument("--rows-out", type=Path, default=None,
                        help="append each seed's measured rows to this file (JSON lines), for --from-rows")
    parser.add_argument("--by-class-age", action="store_true",
                        help="also measure every update on the classes the old model saw and on the others")
    parser.add_argument("--jobs", type=int, default=1,
                        help="tables (dataset, budget, seed) measured at once, each in its own process")
    parser.add_argument("--from-rows", type=Path, nargs="+", default=None,
                        help="train nothing: report the tables of these --rows-out files (seeds run apart)")
    parser.add_argument("--upgrade", choices=("extended-class", cross_arch.UPGRADE), default="extended-class",
                        help="cross-arch: independently trained encoders of two architectures, post-hoc maps "
                             "against lambda_orth and fct (benchmarks/cross_arch.py; --methods is not used)")
    parser.add_argument("--new-arch", default=cross_arch.NEW_ARCH,
                        help="with --upgrade cross-arch: the new encoder's architecture (the old one's is test_resnet)")
    parser.add_argument("--readme", type=Path, default=None,
                        help="with --upgrade cross-arch --from-rows: rewrite the generated section of this file")
    args = parser.parse_args(argv)
    if args.upgrade == cross_arch.UPGRADE:
        return _cross_arch_main(args)

    def emit(text: str) -> None:
        print(text, flush=True)
        if args.out is not None:
            with open(args.out, "a", encoding="utf-8") as handle:
                handle.write(text + "\n")

    if args.from_rows is not None:
        for (dataset, epochs), tables in read_rows(args.from_rows).items():
            emit(report(dataset, epochs, tables, f"({len(tables)} tables)"))
        return 0
    known = {row[0]: row for row in METHODS}
    unknown = [m for m in args.methods.split(",") if m not in known]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; known: {', '.join(known)}")
    methods = [known[m] for m in args.methods.split(",")]
    tables_of = [(dataset, int(epochs), int(seed)) for dataset in args.datasets.split(",")
                 for epochs in args.epochs.split(",") for seed in args.seeds.split(",")]
    measured: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for (dataset, epochs, seed), (rows, seconds) in _measure_all(tables_of, methods, args):
        measured[dataset, epochs, seed] = rows
        if args.rows_out is not None:
            record = {"dataset": dataset, "epochs": epochs, "seed": seed, "seconds": round(seconds, 1),
                      "device": args.device, "rows": rows}
            with open(args.rows_out, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
        emit(f"### {dataset}, {epochs} epochs, seed {seed} ({seconds:.0f} s)\n\n"
             + format_table(rows) + "\n\n" + "\n".join(f"- {line}" for line in orderings(rows)) + "\n"
             + "".join(f"\n{CLASS_AGES[part].capitalize()}:\n\n{format_table(table)}\n"
                       for part, table in class_age_tables(rows)))
    for dataset, epochs in dict.fromkeys((d, e) for d, e, _ in tables_of):
        emit(report(dataset, epochs, [measured[key] for key in tables_of if key[:2] == (dataset, epochs)], args.seeds))
    return 0


def read_cross_arch(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """The records of ``--upgrade cross-arch --rows-out`` files (``json_lines``: a line without one
    of the record's fields, or of another upgrade, is an error naming its file and line)."""
    def parse(record: dict[str, Any]) -> dict[str, Any]:
        if record["upgrade"] != cross_arch.UPGRADE:
            raise ValueError(f"upgrade is {record['upgrade']!r}")
        for key in ("dataset", "epochs", "seed", "old_arch", "new_arch", "rows"):
            record[key]  # noqa: B018  (a KeyError names the missing field)
        return record

    return json_lines(paths, "a --upgrade cross-arch record", parse)


def _cross_arch_main(args: argparse.Namespace) -> int:
    """``--upgrade cross-arch``: measure (one table per dataset, budget and seed, each stored as it
    comes with ``--rows-out``) or, with ``--from-rows``, print (and ``--readme``: rewrite) the section."""
    if args.from_rows is not None:
        text = cross_arch.section(read_cross_arch(args.from_rows))
        if args.readme is not None:
            rewrite_section(args.readme, text, cross_arch.BEGIN, cross_arch.END)
        print(text)
        return 0
    for dataset in args.datasets.split(","):
        for epochs in map(int, args.epochs.split(",")):
            for seed in map(int, args.seeds.split(",")):
                experiment = experiment_for(dataset, epochs, seed, args.test_per_class, args.device)
                experiment.settings = experiment.settings.model_copy(update={"new_arch": args.new_arch})
                started = time.perf_counter()
                rows = cross_arch.measure(experiment, args.workers)
                seconds = time.perf_counter() - started
                record = {"upgrade": cross_arch.UPGRADE, "dataset": dataset, "epochs": epochs, "seed": seed,
                          "old_arch": experiment.settings.arch, "new_arch": args.new_arch,
                          "seconds": round(seconds, 1), "device": args.device, "rows": rows}
                if args.rows_out is not None:
                    with open(args.rows_out, "a", encoding="utf-8") as handle:
                        handle.write(json.dumps(record) + "\n")
                print(f"### {dataset}, {epochs} epochs, seed {seed} ({seconds:.0f} s)\n\n"
                      + cross_arch.format_table([rows]) + "\n", flush=True)
    return 0


def _timed_measure(experiment: UpdateExperiment, methods: Sequence[Row], workers: int, by_class_age: bool
                   ) -> tuple[list[dict[str, Any]], float]:
    started = time.perf_counter()
    rows = measure_experiment(experiment, methods, workers, by_class_age)
    return rows, time.perf_counter() - started


def _measure_all(tables_of: Sequence[tuple[str, int, int]], methods: Sequence[Row], args: argparse.Namespace):
    """Yield ((dataset, epochs, seed), (rows, seconds)) for every table: one after the other, or
    ``--jobs`` tables at once, each in its own process (yielded as they finish)."""
    def experiment(dataset: str, epochs: int, seed: int) -> UpdateExperiment:
        return experiment_for(dataset, epochs, seed, args.test_per_class, args.device)

    if args.jobs == 1:
        for key in tables_of:
            yield key, _timed_measure(experiment(*key), methods, args.workers, args.by_class_age)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=context, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        futures = {pool.submit(_timed_measure, experiment(*key), methods, args.workers, args.by_class_age): key
                   for key in tables_of}
        for future in as_completed(futures):
            yield futures[future], future.result()


if __name__ == "__main__":
    sys.exit(main())
