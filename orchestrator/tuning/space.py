"""The tune file's search settings as Ray Tune objects: parameter space, searcher, scheduler, and
the concurrency bound. The searcher and ASHA maximise ``objective.OBJECTIVE``, which every trial
reports after every epoch.
"""
from __future__ import annotations

import math
from typing import Any

from orchestrator.tuning.config import ParameterRange, Resources, SchedulerSettings, SearchSettings

EPOCHS = "training_iteration"  # Tune counts one iteration per report, and a trial reports once per epoch


def param_space(space: dict[str, ParameterRange]) -> dict[str, Any]:
    """``{parameter: tune domain}``: grid → ``grid_search``, choice → ``choice``, uniform →
    ``uniform``, loguniform → ``loguniform``."""
    from ray import tune

    domains = {}
    for name, entry in space.items():
        if entry.grid is not None:
            domains[name] = tune.grid_search(list(entry.grid))
        elif entry.choice is not None:
            domains[name] = tune.choice(list(entry.choice))
        elif entry.uniform is not None:
            domains[name] = tune.uniform(*entry.uniform)
        else:
            domains[name] = tune.loguniform(*entry.loguniform)
    return domains



def trial_count(space: dict[str, ParameterRange], num_samples: int) -> int:
    """Trials the sweep creates: Tune repeats the whole grid (every combination of the ``grid``
    parameters) ``num_samples`` times."""
    return num_samples * math.prod(len(entry.grid) for entry in space.values() if entry.grid is not None)

def search_algorithm(settings: SearchSettings, max_concurrent: int):
    """``random``: Tune's variant generator seeded with ``settings.seed``; ``optuna``: Optuna's TPE
    sampler seeded likewise (the objective's metric and mode come from the ``TuneConfig``). Either
    suggests at most ``max_concurrent`` trials at a time."""
    if settings.algorithm == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        return ConcurrencyLimiter(OptunaSearch(seed=settings.seed), max_concurrent=max_concurrent)
    from ray.tune.search import BasicVariantGenerator

    return BasicVariantGenerator(random_state=settings.seed, max_concurrent=max_concurrent)


def scheduler(settings: SchedulerSettings, epochs: int):
    """ASHA over epochs (``max_t`` = the candidate's epochs, so a trial that survives every rung
    trains exactly as the pipeline would), or FIFO (no early stopping)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if settings.kind == "fifo":
        return FIFOScheduler()
    return ASHAScheduler(time_attr=EPOCHS, max_t=epochs, grace_period=settings.grace_period,
                         reduction_factor=settings.reduction_factor)


def max_concurrent_trials(resources: Resources, requested: int | None, cluster: dict[str, float]) -> int:
    """``requested``, or as many trials as the cluster's CPUs (and GPUs, if a trial takes any) hold
    at once, at least one. ``cluster``: ``ray.cluster_resources()``."""
    if requested is not None:
        return requested
    fits = math.floor(cluster.get("CPU", 0.0) / resources.cpu + 1e-9)
    if resources.gpu > 0:
        fits = min(fits, math.floor(cluster.get("GPU", 0.0) / resources.gpu + 1e-9))
    return max(1, fits)
