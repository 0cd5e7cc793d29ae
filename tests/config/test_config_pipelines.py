"""The shipped pipeline files load, and the loader's overrides, hashing and conveniences behave."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.config import (
    PipelineConfig,
    PipelineConfigError,
    config_sha256,
    load_pipeline,
)
from orchestrator.data import training_indices

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"
TUNE_FILES = {"tune.yaml"}  # sweeps over a pipeline (orchestrator tune; tests/tuning)
PIPELINE_FILES = sorted(p for p in PIPELINES.glob("*.yaml") if p.name not in TUNE_FILES)


def test_pipelines_folder_has_the_four_files():
    names = {p.name for p in PIPELINE_FILES}
    assert {"lifelong.yaml", "lifelong_euclidean.yaml", "cifar100_hbct.yaml", "dsimplex_7task.yaml"} <= names


@pytest.mark.parametrize("path", PIPELINE_FILES, ids=lambda p: p.name)
def test_every_pipeline_file_loads(path):
    config = load_pipeline(path)
    assert isinstance(config, PipelineConfig)
    # the normalised form is itself a valid file with the same hash
    again = PipelineConfig.model_validate(yaml.safe_load(config.to_yaml()))
    assert config_sha256(again) == config_sha256(config)


def test_lifelong_is_the_embedded_default():
    config = load_pipeline(PIPELINES / "lifelong.yaml")
    assert config.storage == "./runs/lifelong" and not config.is_remote_storage
    assert config.lineage == "sqlite:///./runs/lifelong/lineage.db"
    assert config.ray.address is None and config.ray.num_workers == 1 and not config.ray.use_gpu
    assert config.data.source == "digits"
    g0, g1, g2 = (config.generation(n) for n in ("g0-old", "g1", "g2"))
    # one compatible hyperbolic chain: old on part of the classes, then all classes, then a new arch
    assert {g.method.name for g in config.generations} == {"hbct"}
    assert g0.parent is None and g0.classes.first_fraction == 0.5 and g0.method.params["clip"] == 1.0
    assert g1.parent == "g0-old" and g1.classes is None and g1.method.params["clip"] == 1.2
    assert g2.parent == "g1" and g2.model.arch != g1.model.arch and g2.method.params["clip"] == 1.4
    assert config.evaluation.reference == "phi-star"
    assert config.generation("phi-star").parent is None
    assert [g.name for g in config.served_generations] == ["g0-old", "g1", "g2"]
    for gen in config.generations:
        assert gen.model.arch in ("test_resnet", "resnet10t") and gen.model.embed_dim == 32
        assert gen.training.epochs == 20 and gen.training.batch_size == 64 and gen.training.lr == 0.05
        assert not gen.training.augment


def test_lifelong_euclidean_has_the_same_shape():
    config = load_pipeline(PIPELINES / "lifelong_euclidean.yaml")
    methods = [(g.name, g.parent, g.method.name) for g in config.generations]
    assert methods == [
        ("g0-old", None, "independent"), ("g1", "g0-old", "bct"), ("g2", "g1", "bct"), ("phi-star", None, "independent")
    ]
    assert config.generation("g2").model.arch == "resnet10t"


def test_cifar100_hbct_matches_the_paper_settings():
    """hbct.md §9-§10: ResNet18, d = 128, 200 epochs, SGD 0.1 / 0.9 / 5e-4 cosine, batch 128."""
    config = load_pipeline(PIPELINES / "cifar100_hbct.yaml")
    assert config.data.source == "cifar100" and config.ray.use_gpu
    old, star, new = config.generations
    assert old.classes.first_fraction == 0.5 and old.method.params["clip"] == 1.0
    assert star.parent is None and config.evaluation.reference == star.name
    assert new.parent == old.name
    for gen in (star, new):
        assert {k: gen.method.params[k] for k in ("clip", "lam", "tau", "beta", "curv")} == {
            "clip": 1.2, "lam": 0.3, "tau": 0.5, "beta": 0.01, "curv": 1.0
        }
    # the paper's fixed MLR logit scale on every generation (the project's default learns it)
    assert all(gen.method.params["mlr_learn_scale"] is False for gen in config.generations)
    for gen in config.generations:
        assert (gen.model.arch, gen.model.embed_dim, gen.model.small_input) == ("resnet18", 128, True)
        t = gen.training
        assert (t.epochs, t.batch_size, t.optimizer, t.lr, t.momentum, t.weight_decay, t.schedule) == (
            200, 128, "sgd", 0.1, 0.9, 5e-4, "cosine"
        )


def test_dsimplex_7task_sequence_with_two_replacements():
    """stationary_dsimplex.md §6.2: [10, 15 x 6] classes, replacements at tasks 3 and 5."""
    config = load_pipeline(PIPELINES / "dsimplex_7task.yaml")
    gens = config.generations
    assert len(gens) == 7 and config.data.task_splits.splits(100) == [
        list(range(0, 10)), *[list(range(10 + 15 * i, 25 + 15 * i)) for i in range(6)]
    ]
    assert [g.classes.task for g in gens] == [1, 2, 3, 4, 5, 6, 7]
    assert [g.name for g in gens if g.replaces] == ["task3", "task5"]
    assert all(g.model.pretrained for g in gens if g.replaces)
    assert all(g.init_from_parent for g in gens[1:] if not g.replaces)
    for g in gens:
        p = g.method.params
        assert (g.method.name, p["num_prototypes"], p["lam"], p["tau"], g.model.embed_dim) == ("dsimplex", 1024, 0.1, 10.0, 1023)
        assert (g.training.lr, g.training.epochs, g.training.batch_size) == (1e-3, 70, 128)
    labels = np.repeat(np.arange(100), 300)
    sizes = [np.unique(labels[training_indices(g, labels, config.data.task_splits)]).size for g in gens]
    assert sizes == [10, 25, 40, 55, 70, 85, 100]
    # the episodic memory of a class is the same items in every later task
    t3, t4 = (training_indices(g, labels, config.data.task_splits) for g in gens[2:4])
    assert set(t3[labels[t3] < 10]) == set(t4[labels[t4] < 10]) and (labels[t3] < 10).sum() == 200


def test_overrides_are_applied_before_validation():
    path = PIPELINES / "lifelong.yaml"
    config = load_pipeline(path, {"storage": "s3://bucket/runs", "lineage": "postgresql://u@db/lineage",
                                  "ray.address": "auto", "generations.0.training.epochs": 1})
    assert config.storage == "s3://bucket/runs" and config.is_remote_storage
    assert config.lineage == "postgresql://u@db/lineage"
    assert config.ray.address == "auto"
    assert config.generations[0].training.epochs == 1 and config.generations[1].training.epochs == 20
    # a new storage moves the default SQLite lineage
    moved = load_pipeline(path, {"storage": "/tmp/elsewhere"})
    assert moved.lineage == "sqlite:////tmp/elsewhere/lineage.db" and moved.ray.address is None


def test_set_null_clears_a_field_and_options_not_given_change_nothing():
    """``--set gallery.source=null`` sets null (it used to be skipped silently, leaving the file's
    CIFAR-10 gallery in place); ``--storage`` and the other named options, when not given, do not
    override anything."""
    import argparse

    from orchestrator.cli_options import PIPELINE_OPTIONS, add_pipeline_options, pipeline_overrides

    parser = argparse.ArgumentParser()
    add_pipeline_options(parser, [option.name for option in PIPELINE_OPTIONS] + ["set"])
    path = PIPELINES / "dsimplex_7task.yaml"
    assert load_pipeline(path).gallery.source == "cifar10"
    args = parser.parse_args(["--set", "gallery.source=null", "--set", "gallery.options=null"])
    config = load_pipeline(path, pipeline_overrides(args))
    assert config.gallery.source is None and config.gallery.options is None
    assert config.storage == load_pipeline(path).storage and config.ray.address is None


def test_a_bad_override_is_reported_as_an_override(tmp_path):
    path = PIPELINES / "lifelong.yaml"
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline(path, {"ray.address": "http://head:8265"})
    assert str(info.value).startswith(f"{path}: ray.address: ")
    assert '(got "http://head:8265") [set by override]' in str(info.value)
    with pytest.raises(PipelineConfigError, match="override storage.x: storage has no field 'x'"):
        load_pipeline(path, {"storage.x": 1})


def test_config_sha256_ignores_key_order_and_tracks_values(tmp_path):
    raw = yaml.safe_load((PIPELINES / "lifelong.yaml").read_text())
    reordered = dict(reversed(list(raw.items())))
    reordered["generations"] = [dict(reversed(list(g.items()))) for g in raw["generations"]]
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(raw, sort_keys=False))
    b.write_text(yaml.safe_dump(reordered, sort_keys=False))
    digest = config_sha256(load_pipeline(a))
    assert len(digest) == 64 and digest == config_sha256(load_pipeline(b))
    assert digest == config_sha256(load_pipeline(PIPELINES / "lifelong.yaml"))  # comments, anchors
    # spelling out a default does not change it; changing a value does
    raw["generations"][1]["method"]["params"]["lam"] = 0.3
    a.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert config_sha256(load_pipeline(a)) == digest
    raw["generations"][1]["method"]["params"]["lam"] = 0.4
    a.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert config_sha256(load_pipeline(a)) != digest
    assert config_sha256(load_pipeline(PIPELINES / "lifelong.yaml", {"ray.address": "auto"})) != digest
    assert config_sha256(load_pipeline(PIPELINES / "lifelong.yaml", {"ray.address": "auto"}), exclude=("ray",)) == \
        config_sha256(load_pipeline(PIPELINES / "lifelong.yaml"), exclude=("ray",))


def test_training_indices_selections():
    labels = np.repeat(np.arange(10), 20)
    base = {"name": "g", "method": {"name": "hbct"}}
    from orchestrator.config import GenerationSpec

    def pick(**fields):
        return training_indices(GenerationSpec.model_validate({**base, **fields}), labels)

    assert pick().size == 200
    assert set(labels[pick(classes=[3, 7])]) == {3, 7}
    assert set(labels[pick(classes={"first_fraction": 0.5})]) == {0, 1, 2, 3, 4}
    half = pick(data_fraction=0.3)
    assert half.size == 60 and np.all(np.bincount(labels[half]) == 6)
    assert np.array_equal(half, pick(data_fraction=0.3)) and not np.array_equal(half, pick(data_fraction=0.3, data_seed=1))


def test_loader_kwargs_for_splits():
    config = load_pipeline(PIPELINES / "lifelong.yaml")
    assert config.data.loader_kwargs("train") == {"split": "train", "image_size": 32}
    assert config.gallery_loader_kwargs() == ("digits", {"split": "test", "image_size": 32})
    folder = PipelineConfig.model_validate({
        "name": "f", "generations": [{"name": "a", "method": {"name": "hbct"}}],
        "data": {"source": "image_folder", "split_options": {"train": {"root": "tr"}, "test": {"root": "te"}}},
    })
    assert folder.data.loader_kwargs("test") == {"root": "te", "image_size": 32}
    assert folder.gallery_loader_kwargs() == ("image_folder", {"root": "te", "image_size": 32})


def test_ray_local_address_means_a_local_ray():
    from orchestrator.config import RaySettings

    assert RaySettings(address="local").address is None
