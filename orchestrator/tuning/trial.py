"""One Tune trial: train the candidate generation with the trial's parameters and evaluate it
against its parent after every epoch.

Design: the trial function runs the training loop itself, in the trial's own process, with
``GenerationTraining`` (the same data, seeded model building, frozen parent, method hooks and
``train_one_epoch`` as a Ray Train worker of the pipeline). It is not a ``TorchTrainer`` nested in
Tune: a trial of a compatibility sweep is one small model on one worker; a nested Ray Train run
would add a controller and a worker group per trial (about 15 s of start-up per run on 2 cores,
README) and the per-epoch evaluation ASHA decides on would have to travel from the Train worker
through Train's reports into Tune's. The plain loop reports it directly, once per epoch. The
pipeline keeps ``train_generation_with_ray``.

Determinism: the job is the pipeline's own job for the candidate (``PipelineRunner.generation_job``:
same items, normalisation and seed derived from the generation's name), with the trial's method
parameters. The per-epoch evaluation runs under ``torch.random.fork_rng`` and leaves the model's
train/eval mode as it found it, so a trial that runs all its epochs trains bit for bit the model
the pipeline trains from its best configuration (one worker, same thread count).

Per epoch a trial reports (``orchestrator.tuning.config.METRIC_NAMES``): ``self_<m>`` and
``cross_<m>`` for m in cmc@1, cmc@5, map, ``old_self_<m>`` (the parent's own), and, with an
evaluation reference, ``p_com_<m>`` and ``p_up_<m>``; ``objective`` (``objective.scalar``),
``feasible``, ``loss`` and ``lr``. A trial that runs every epoch writes its generation
(safetensors + card) to ``<sweep>/candidates/<trial id>`` before its last report.

The pipeline's health check (``orchestrator.training.health``, the candidate's ``health``) is
judged after every epoch as in ``orchestrator run``: a trial that does not learn reports its
epoch with ``collapsed`` (the check's one line) and ends there, writing nothing; the sweep's table
calls its outcome ``collapsed`` (``results``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from orchestrator.data import ImageTensorDataset, load_source
from orchestrator.evaluation import compare_generations, embed_split, sample_split
from orchestrator.gc_startup import startup_phase
from orchestrator.methods.loading import load_generation
from orchestrator.metrics import METRICS, NORMALISED_SCORES
from orchestrator.models.bundle import CompatibleModel
from orchestrator.storage import join_uri
from orchestrator.training.generation import GenerationJob, GenerationTraining
from orchestrator.training.health import COLLAPSED
from orchestrator.tuning import objective as objectives
from orchestrator.tuning.config import Objective


@dataclass(frozen=True)
class TrialSetup:
    """What every trial of a sweep shares (JSON-able; handed to trials by ``tune.with_parameters``).

    job:            the candidate's ``GenerationJob`` (as a dict) with the pipeline's parameters;
                    a trial overrides the searched ones.
    eval_source, eval_options, image_size: the evaluation split's loader, as the pipeline loads it.
    eval_sample:    ``evaluation.eval_sample``: the trial evaluates on the pipeline's sample of it.
    reference_self: metric → M(φ_*; φ_*) of the evaluation reference, or None (no P_com / P_up).
    objective:      the tune file's objective (as a dict).
    candidates_uri: folder of the finished trials' generations.
    threads:        torch CPU threads of a trial (its CPUs).
    """

    job: dict[str, Any]
    eval_source: str
    eval_options: dict[str, Any]
    image_size: int
    reference_self: dict[str, float] | None
    objective: dict[str, Any]
    candidates_uri: str
    threads: int = 1
    eval_sample: int | None = None


class TrialEvaluator:
    """Self and cross retrieval of a candidate model against its parent, on the evaluation sample,
    through the pipeline's ``embed_split`` and ``compare_generations`` (so the numbers are the
    pipeline's). The frozen parent embeds the sample once, here; each call embeds the candidate."""

    def __init__(self, setup: TrialSetup, job: GenerationJob):
        images = sample_split(load_source(setup.eval_source, **setup.eval_options), setup.eval_sample)
        self.data = ImageTensorDataset(images, setup.image_size, job.mean, job.std)
        self.parent_name, self.name = job.parent_name, job.name
        self.parent, _card = load_generation(job.parent_uri, expected_sha256=job.parent_sha256,
                                             storage_options=job.storage_options)
        with torch.random.fork_rng(devices=[]):
            self.parent_embeddings = embed_split(self.parent, self.data)
        self.reference_self = setup.reference_self

    def __call__(self, model: CompatibleModel) -> dict[str, float]:
        """``self_<m>``, ``cross_<m>``, ``old_self_<m>`` and (with a reference) ``p_com_<m>``,
        ``p_up_<m>`` for m in ``METRICS``; NaN where no common distance exists."""
        with torch.random.fork_rng(devices=[]):
            embedded = {self.parent_name: self.parent_embeddings, self.name: embed_split(model, self.data)}
            report = compare_generations({self.parent_name: self.parent, self.name: model}, embedded,
                                         parents={self.name: self.parent_name})
        metrics: dict[str, float] = {}
        for metric in METRICS:
            summary = report.update_summary(self.parent_name, self.name, metric, reference_self=(
                None if self.reference_self is None else self.reference_self[metric]))
            keys = ("self", "cross", "old_self") + (() if self.reference_self is None else NORMALISED_SCORES)
            metrics.update({f"{key}_{metric}": summary[key] for key in keys})
        return metrics


def trial_job(setup: TrialSetup, params: dict[str, Any]) -> GenerationJob:
    """The candidate's job with the trial's method parameters over the pipeline's."""
    job = GenerationJob(**setup.job)
    return dataclasses.replace(job, method_params={**job.method_params, **params})


def run_trial(config: dict[str, Any], setup: dict[str, Any]) -> None:
    """The Tune function trainable: ``config`` holds the searched method parameters, ``setup`` a
    ``TrialSetup`` as a dict. Reports once per epoch (module docstring)."""
    with startup_phase():  # Ray Tune, the parent, the data, the model (gc_startup)
        from ray import tune

        shared = TrialSetup(**setup)
        objective = Objective.model_validate(shared.objective)
        torch.set_num_threads(shared.threads)
        job = trial_job(shared, config)
        evaluate = TrialEvaluator(shared, job)  # first: loading the parent draws from torch's RNG, and
        session = GenerationTraining(job)       # the session seeds it, as a Ray Train worker does
        session.watch_health()
        session.start()
    epochs = session.epochs  # 0 for a post-hoc method: its map is fitted once, and reported once
    for epoch in range(max(epochs, 1)):
        stats = session.train_epoch(epoch) if epochs else {"lr": 0.0}
        stop = session.check_health(epoch, stats) if epochs else None
        last = epoch == max(epochs, 1) - 1 and stop is None
        if last:
            session.finish()
            stats = {**stats, **session.fit_metrics()}  # a post-hoc map's loss: its fit's
            stop = session.check_health_at_end()
            last = stop is None
        metrics = evaluate(session.model)
        if last:
            trial_id = tune.get_context().get_trial_id()
            session.save(join_uri(shared.candidates_uri, trial_id), extra={"trial_id": trial_id, "params": config})
        health = {} if stop is None else {COLLAPSED: stop.line}
        tune.report({**metrics, objectives.OBJECTIVE: objectives.scalar(metrics, objective),
                     "feasible": objectives.feasible(metrics, objective), "loss": stats["loss"], "lr": stats["lr"],
                     **health})
        if stop is not None:
            return
