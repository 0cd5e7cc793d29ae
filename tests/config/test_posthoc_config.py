"""A generation that trains no encoder (config/posthoc.py): what validation accepts, and the one line
it answers with where a file asks a post-hoc generation for anything but a map."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import PipelineConfigError, load_pipeline
from orchestrator.pipeline.step_specs import train_spec

POSTHOC = Path(__file__).resolve().parents[2] / "pipelines" / "posthoc.yaml"


def _refused(overrides: dict) -> str:
    with pytest.raises(PipelineConfigError) as refused:
        load_pipeline(POSTHOC, overrides)
    return str(refused.value)


def test_the_posthoc_pipeline_takes_an_earlier_generations_encoder():
    config = load_pipeline(POSTHOC)
    posthoc = config.generations[2]
    assert posthoc.encoder_from == "independent" and posthoc.parent == "g0-old"
    assert posthoc.method.params["pairs"] == 2000 and posthoc.method.params["pairs_from"] == "train"
    assert config.evaluation.reference == "independent"
    assert [g.name for g in config.served_generations] == ["g0-old", "g1-posthoc"]
    # the given encoder's checkpoint is part of what the train step ran from
    assert train_spec(config, posthoc, "p" * 64, "e" * 64)["encoder_sha256"] == "e" * 64
    assert "encoder_sha256" not in train_spec(config, config.generations[0], None)


@pytest.mark.parametrize("overrides, says", [
    ({"generations.2.training.epochs": 3},
     "generations[2].training.epochs: unused: method 'low_rank_affine' trains nothing, its encoder is given and frozen"),
    ({"generations.2.init_from_parent": True}, "generations[2].init_from_parent: method 'low_rank_affine': its encoder "
                                               "is given and frozen (backbone, projection, lift and head)"),
    ({"generations.2.encoder_from": None}, "generations[2].encoder_from: method 'low_rank_affine' trains no encoder: "
                                           "give the encoder it takes as given"),
    ({"generations.2.model.pretrained": "hub", "generations.2.encoder_from": None},
     "trains no encoder: give the encoder it takes as given, encoder_from: <an earlier generation> or "
     "model.pretrained: <a local file> (no download)"),
    ({"generations.2.model.pretrained": "weights.safetensors"},
     "generations[2].model.pretrained: unused with encoder_from"),
    ({"generations.1.encoder_from": "g0-old"}, "generations[1].encoder_from: takes a generation's encoder unchanged, "
                                               "for a method that trains no encoder"),
    ({"generations.2.encoder_from": "g1-posthoc"}, "generations[2].encoder_from: not a generation defined before "
                                                   "this one"),
    ({"generations.2.method.params.clip": 1.0}, "generations[2].method.params: the given encoder embeds as "
                                                "'independent' trained it: space, curv, clip ('lorentz', 1.0, 1.2)"),
    ({"generations.2.model.embed_dim": 16}, "generations[2].model: must be the settings of the encoder it takes, "
                                            "'independent''s: embed_dim 32"),
    ({"generations.2.parent": None}, "generations[2].parent: method 'low_rank_affine' aligns a model to its parent"),
    ({"generations.2.method.params.pairs_from": "gallery", "gallery.source": "digits"},
     "generations[2].method.params.pairs_from: the paired sample is drawn from the gallery's split of data.source"),
])
def test_validation_says_what_is_frozen(overrides, says):
    assert says in _refused(overrides)


def test_a_local_checkpoint_is_a_given_encoder_too():
    config = load_pipeline(POSTHOC, {"generations.2.encoder_from": None,
                                     "generations.2.model.pretrained": "independent.safetensors"})
    assert config.generations[2].model.pretrained == "independent.safetensors"


def test_the_maps_cannot_write_into_the_poincare_ball():
    says = _refused({"generations.0.method": {"name": "binary_hyperbolic", "params": {"num_prototypes": 10}}})
    assert "generations[2].parent: method 'low_rank_affine' maps into its parent's space: cosine, euclidean or " \
           "lorentz, not the Poincaré ball" in says
