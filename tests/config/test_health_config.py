"""A generation's ``health`` section (issue 38, item 1): its defaults, its bounds named per field,
and that it is no part of what a committed train step ran from."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import PipelineConfigError, load_pipeline
from orchestrator.pipeline.step_specs import train_spec
from orchestrator.training.config import HealthSpec

LIFELONG = Path(__file__).resolve().parents[2] / "pipelines" / "lifelong.yaml"


def test_every_generation_is_checked_by_default():
    config = load_pipeline(LIFELONG)
    assert all(g.health == HealthSpec() for g in config.generations)
    assert HealthSpec().model_dump() == {"enabled": True, "sample": 500, "min_epochs": 3, "min_fraction": 0.25,
                                         "chance_sigmas": 3.0, "chance_margin": 0.02, "min_loss_drop": 0.01,
                                         "min_fit_drop": 0.01}


def test_thresholds_are_set_per_generation_and_checked():
    config = load_pipeline(LIFELONG, {"generations.1.health.chance_sigmas": 2, "generations.2.health.enabled": False})
    assert config.generations[1].health.chance_sigmas == 2 and not config.generations[2].health.enabled
    with pytest.raises(PipelineConfigError, match=r"generations\[1\]\.health\.min_loss_drop"):
        load_pipeline(LIFELONG, {"generations.1.health.min_loss_drop": 1.5})
    with pytest.raises(PipelineConfigError, match=r"generations\[0\]\.health\.thresholds"):
        load_pipeline(LIFELONG, {"generations.0.health.thresholds": 1})


def test_the_health_settings_are_not_in_the_train_steps_spec():
    base = load_pipeline(LIFELONG)
    changed = load_pipeline(LIFELONG, {"generations.0.health.enabled": False})
    assert train_spec(base, base.generations[0], None) == train_spec(changed, changed.generations[0], None)
    assert "health" not in train_spec(base, base.generations[0], None)["generation"]
