"""What a sweep leaves behind: the table of every trial (CSV and Parquet), the self-vs-cross Pareto
plot (PNG), the best configuration as a generation block for the pipeline file (YAML), and the
trials in the lineage as candidate generations.

A row per trial: ``trial_id``, ``outcome`` (finished: ran every epoch; stopped: by ASHA; collapsed:
stopped by the health check, ``collapsed`` holding its one line; error),
``epochs`` run, ``seconds``, ``param_<name>`` for each searched parameter, the trial's last
reported metrics (``METRIC_NAMES``, ``old_self_<m>``, ``objective``, ``feasible``), ``pareto``
(on the front of the plotted pair among finished trials), ``best`` and ``checkpoint_uri``.

Decision: the Pareto front and the best configuration are taken among *finished* trials only. A
trial ASHA stopped reports numbers of an unfinished training, which its configuration, pasted into
the pipeline (which trains every epoch), would not reproduce.
"""
from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from orchestrator.config import GenerationSpec
from orchestrator.lineage import LineageStore
from orchestrator.metrics import METRICS, format_value
from orchestrator.models.checkpoint import load_card
from orchestrator.storage import join_uri, write_bytes_atomic
from orchestrator.training.config import STOP as HEALTH_STOP
from orchestrator.tuning import objective as objectives
from orchestrator.tuning.config import METRIC_NAMES, Objective, TuneFile

OUTCOMES = ("finished", "stopped", "collapsed", "error")
FILES = {"csv": "trials.csv", "parquet": "trials.parquet", "plot": "pareto.png", "best": "best_generation.yaml"}
REPORTED = (*METRIC_NAMES, *(f"old_self_{m}" for m in METRICS), objectives.OBJECTIVE, "feasible")


@dataclass
class TrialRow:
    """One trial: id, outcome, epochs run, seconds, its parameters and its last reported metrics."""

    trial_id: str
    outcome: str
    epochs: int
    seconds: float
    params: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint_uri: str | None = None
    pareto: bool = False
    best: bool = False
    collapsed: str | None = None  # the health check's line, for a collapsed trial

    def record(self, space: Sequence[str]) -> dict[str, Any]:
        """The flat table row (module docstring)."""
        row: dict[str, Any] = {"trial_id": self.trial_id, "outcome": self.outcome, "epochs": self.epochs,
                               "seconds": round(self.seconds, 3)}
        row.update({f"param_{name}": self.params.get(name) for name in space})
        row.update({name: _number(self.metrics.get(name)) for name in REPORTED})
        row.update(pareto=self.pareto, best=self.best, checkpoint_uri=self.checkpoint_uri, collapsed=self.collapsed)
        return row


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def plot_axes(objective: Objective) -> tuple[str, str]:
    """The (x, y) metrics of the Pareto plot: the objective's pair, or self vs cross of the
    retrieval metric the objective is about (``cross_map`` → self_map, cross_map)."""
    if objective.pareto is not None:
        return objective.pareto
    metric = next(m for m in METRICS if objective.maximize.endswith(m))
    return f"self_{metric}", f"cross_{metric}"


def mark_front_and_best(rows: list[TrialRow], objective: Objective) -> TrialRow | None:
    """Set ``pareto`` (front of ``plot_axes`` among finished rows) and ``best`` (``best_index``
    among finished rows); returns the best row, or None when no finished row qualifies."""
    finished = [row for row in rows if row.outcome == "finished"]
    if not finished:
        return None
    x, y = plot_axes(objective)
    front = objectives.pareto_front(np.array([[_number(r.metrics.get(x)), _number(r.metrics.get(y))] for r in finished]))
    for row, on_front in zip(finished, front):
        row.pareto = bool(on_front)
    index = objectives.best_index([row.metrics for row in finished], objective)
    if index is None:
        return None
    finished[index].best = True
    return finished[index]


def table_bytes(records: list[dict[str, Any]]) -> tuple[bytes, bytes]:
    """(CSV, Parquet) encodings of the flat rows (same columns; NaN as an empty CSV cell)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = list(records[0]) if records else ["trial_id"]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in record.items()})
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records) if records else pa.table({"trial_id": pa.array([], pa.string())}), buffer)
    return text.getvalue().encode(), buffer.getvalue()


def pareto_png(rows: list[TrialRow], axes: tuple[str, str], title: str) -> bytes:
    """Scatter of every trial on ``axes`` (finished: filled, stopped early: hollow), the Pareto
    front of the finished ones joined by a line, the best trial starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_name, y_name = axes
    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=110)
    for outcome, style in (("finished", {"color": "tab:blue"}), ("stopped", {"facecolors": "none", "edgecolors": "tab:gray"})):
        points = [(r.metrics.get(x_name), r.metrics.get(y_name)) for r in rows if r.outcome == outcome]
        points = [p for p in points if p[0] is not None and p[1] is not None]
        if points:
            ax.scatter(*zip(*points), s=28, label=f"{outcome} ({len(points)})", **style)
    front = sorted((r.metrics[x_name], r.metrics[y_name]) for r in rows if r.pareto)
    if front:
        ax.plot(*zip(*front), color="tab:red", linewidth=1.2, label="Pareto front")
    best = [r for r in rows if r.best]
    if best:
        ax.scatter([best[0].metrics[x_name]], [best[0].metrics[y_name]], marker="*", s=160, color="tab:orange",
                   zorder=3, label=f"best ({best[0].trial_id})")
    ax.set_xlabel(f"{x_name} (candidate queries, candidate gallery)")
    ax.set_ylabel(f"{y_name} (candidate queries, parent gallery)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()


def best_generation_block(tune_file: TuneFile, best: TrialRow) -> str:
    """The candidate's generation block with the best trial's parameters, as YAML text (a one-item
    list, to paste over the candidate in the pipeline's ``generations``), every field spelled out.
    Validated as a ``GenerationSpec`` before it is returned."""
    block = tune_file.candidate.model_dump(mode="json")
    block["method"]["params"] = {**block["method"]["params"], **best.params}
    GenerationSpec.model_validate(block)
    spec = tune_file.spec
    shown = ", ".join(f"{name} {format_value(best.metrics.get(name), 4)}" for name in
                      dict.fromkeys([*spec.objective.metrics, *plot_axes(spec.objective)]))
    header = (f"# Best configuration of sweep {spec.name!r} (trial {best.trial_id}, {best.epochs} epochs): {shown}\n"
              f"# Paste over generation {block['name']!r} in {spec.pipeline}. Keep its name: the training seed\n"
              f"# derives from it, and with it the pipeline reproduces these numbers.\n")
    return header + yaml.safe_dump([block], sort_keys=False, allow_unicode=True)


def write_results(folder: str, tune_file: TuneFile, rows: list[TrialRow], best: TrialRow | None) -> dict[str, str]:
    """Write the table, the plot and (when a best trial exists) the generation block under
    ``folder``; returns kind → URI of what was written."""
    spec = tune_file.spec
    records = [row.record(list(spec.space)) for row in rows]
    csv_bytes, parquet_bytes = table_bytes(records)
    written = {}
    title = f"sweep {spec.name}: {tune_file.candidate.parent} → {tune_file.candidate.name}, {len(rows)} trials"
    for kind, data in (("csv", csv_bytes), ("parquet", parquet_bytes),
                       ("plot", pareto_png(rows, plot_axes(spec.objective), title))):
        written[kind] = join_uri(folder, FILES[kind])
        write_bytes_atomic(written[kind], data)
    if best is not None:
        written["best"] = join_uri(folder, FILES["best"])
        write_bytes_atomic(written["best"], best_generation_block(tune_file, best).encode())
    return written


def candidate_name(sweep: str, trial_id: str) -> str:
    """The lineage name of a trial's candidate generation."""
    return f"{sweep}/{trial_id}"


def record_candidates(store: LineageStore, tune_file: TuneFile, rows: list[TrialRow]) -> None:
    """Every trial as a candidate generation under the candidate's parent: its parameters, last
    metrics, outcome and epochs, its checkpoint (finished trials) and its self / cross values on the
    evaluation split (``LineageStore.record_candidate``; idempotent)."""
    spec, candidate = tune_file.spec, tune_file.candidate
    dataset = tune_file.pipeline.data.eval_split
    for row in rows:
        name = candidate_name(spec.name, row.trial_id)
        card = load_card(row.checkpoint_uri) if row.checkpoint_uri is not None else None
        compatibility = [(name, gallery, metric, row.metrics[f"{kind}_{metric}"], dataset)
                         for kind, gallery in (("self", name), ("cross", candidate.parent)) for metric in METRICS
                         if f"{kind}_{metric}" in row.metrics]
        # the lineage's outcomes are those of its schema: a collapsed trial is a stopped one whose
        # metrics hold the health check's line (``orchestrator lineage`` shows it as collapsed)
        health = {} if row.collapsed is None else {HEALTH_STOP: row.collapsed}
        store.record_candidate(
            name, sweep=spec.name, trial_id=row.trial_id, parent=candidate.parent, method=candidate.method.name,
            params={**candidate.method.params, **row.params},
            outcome="stopped" if row.outcome == "collapsed" else row.outcome, epochs=row.epochs,
            objective=row.metrics.get(objectives.OBJECTIVE),
            metrics={**{k: row.metrics[k] for k in REPORTED if k in row.metrics}, **health}, arch=candidate.model.arch,
            space=None if card is None else card.space, curv=None if card is None else card.curv,
            checkpoint_uri=row.checkpoint_uri, sha256=None if card is None else card.sha256,
            compatibility=compatibility,
        )
