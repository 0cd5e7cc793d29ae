"""The tune file's search settings as Ray Tune objects: domains with the file's bounds, the seeded
searchers with the concurrency bound, ASHA over epochs, and the default concurrency from the
cluster's resources."""
from __future__ import annotations

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch
from ray.tune.search.sample import Categorical, Float, LogUniform

from orchestrator.tuning.config import ParameterRange, Resources, SchedulerSettings, SearchSettings
from orchestrator.tuning.space import max_concurrent_trials, param_space, scheduler, search_algorithm


def test_each_kind_of_range_becomes_its_tune_domain():
    space = param_space({
        "lam": ParameterRange(loguniform=(0.03, 3.0)),
        "clip": ParameterRange(uniform=(1.1, 1.4)),
        "entail": ParameterRange(choice=[True, False]),
        "tau": ParameterRange(grid=[0.1, 0.5]),
    })
    assert isinstance(space["lam"], Float) and isinstance(space["lam"].get_sampler(), LogUniform)
    assert (space["lam"].lower, space["lam"].upper) == (0.03, 3.0)
    assert isinstance(space["clip"], Float) and (space["clip"].lower, space["clip"].upper) == (1.1, 1.4)
    assert isinstance(space["entail"], Categorical) and space["entail"].categories == [True, False]
    assert space["tau"] == tune.grid_search([0.1, 0.5])


def test_searchers_are_seeded_and_bounded():
    random = search_algorithm(SearchSettings(algorithm="random", seed=3), max_concurrent=2)
    assert isinstance(random, BasicVariantGenerator) and random.max_concurrent == 2
    optuna = search_algorithm(SearchSettings(algorithm="optuna", seed=3), max_concurrent=4)
    assert isinstance(optuna, ConcurrencyLimiter) and optuna.max_concurrent == 4
    assert isinstance(optuna.searcher, OptunaSearch) and optuna.searcher._seed == 3


def test_asha_runs_over_the_candidates_epochs():
    asha = scheduler(SchedulerSettings(kind="asha", grace_period=2, reduction_factor=3), epochs=20)
    assert isinstance(asha, ASHAScheduler)
    assert asha._time_attr == "training_iteration" and asha._max_t == 20
    assert [milestone for milestone, _ in asha._brackets[0]._rungs] == [18, 6, 2]  # grace · 3^k below max_t
    assert isinstance(scheduler(SchedulerSettings(kind="fifo"), epochs=20), FIFOScheduler)


@pytest.mark.parametrize("resources, requested, cluster, expected", [
    (Resources(cpu=1), None, {"CPU": 2.0}, 2),
    (Resources(cpu=2), None, {"CPU": 7.0}, 3),
    (Resources(cpu=0.5), None, {"CPU": 2.0}, 4),
    (Resources(cpu=1, gpu=1), None, {"CPU": 16.0, "GPU": 2.0}, 2),
    (Resources(cpu=4), None, {"CPU": 2.0}, 1),  # never zero: Tune queues the trial until it fits
    (Resources(cpu=1), 5, {"CPU": 2.0}, 5),  # the file's value wins
])
def test_default_concurrency_comes_from_the_cluster(resources, requested, cluster, expected):
    assert max_concurrent_trials(resources, requested, cluster) == expected
