"""Bad pipeline files: one line per problem, naming the file, the field path and the bad value."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from orchestrator.config import GenerationSpec, PipelineConfig, PipelineConfigError, load_pipeline
from valid_pipeline import VALID

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"


def write(tmp_path, text: str, name: str = "bad.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def errors_of(path, overrides=None) -> str:
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline(path, overrides)
    message = str(info.value)
    assert info.value.file == str(path)
    assert all(line.startswith(f"{path}: ") for line in message.splitlines()), message
    return message


def test_the_valid_base_loads(tmp_path):
    config = load_pipeline(write(tmp_path, VALID))
    assert [g.name for g in config.generations] == ["g0", "g1"]


def test_unknown_top_level_field(tmp_path):
    path = write(tmp_path, VALID + "storge: ./somewhere\n")
    message = errors_of(path)
    assert message.startswith(f"{path}: storge: unknown field (did you mean 'storage'?)")
    assert '(got "./somewhere") [line 10]' in message
    assert len(message.splitlines()) == 1


def test_typo_inside_a_generation(tmp_path):
    path = write(tmp_path, VALID + "    training: {epoch: 3}\n")
    message = errors_of(path)
    assert f"{path}: generations[1].training.epoch: unknown field (did you mean 'epochs'?)" in message
    assert "(got 3) [line 10]" in message


def test_typo_in_a_generation_key(tmp_path):
    path = write(tmp_path, VALID.replace("    parent: g0", "    parnt: g0"))
    message = errors_of(path)
    assert f"{path}: generations[1].parnt: unknown field (did you mean 'parent'?)" in message
    assert '(got "g0")' in message


def test_bad_method_parameter_names_its_path_and_value(tmp_path):
    path = write(tmp_path, VALID.replace("lam: 0.3", "lam: -1"))
    message = errors_of(path)
    assert message == (
        f"{path}: generations[1].method.params.lam: Input should be greater than or equal to 0 (got -1) [line 9]"
    )


def test_unknown_method_parameter(tmp_path):
    path = write(tmp_path, VALID.replace("lam: 0.3", "lamda: 0.3"))
    message = errors_of(path)
    assert f"{path}: generations[1].method.params.lamda: unknown field (did you mean 'lam'?); allowed: curv, clip, lam" in message
    assert "(got 0.3)" in message


def test_unknown_method_name(tmp_path):
    path = write(tmp_path, VALID.replace("{name: hbct, params: {lam: 0.3}}", "{name: hbtc}"))
    message = errors_of(path)
    assert f"{path}: generations[1].method.name: unknown method (did you mean 'hbct'?); known methods: " in message
    assert '(got "hbtc")' in message


def test_missing_parent(tmp_path):
    path = write(tmp_path, VALID.replace("parent: g0", "parent: g9"))
    message = errors_of(path)
    assert f"{path}: generations[1].parent: unknown generation" in message
    assert '(got "g9") [line 8]' in message


def test_parent_defined_after_its_child(tmp_path):
    path = write(tmp_path, VALID.replace("  - name: g0\n", "  - name: g0\n    parent: g1\n"))
    message = errors_of(path)
    assert f"{path}: generations[0].parent: a parent must be defined before its child (it is generations[1])" in message
    assert '(got "g1")' in message


def test_duplicate_generation_names(tmp_path):
    path = write(tmp_path, VALID.replace("name: g1", "name: g0").replace("parent: g0", "parent: null"))
    message = errors_of(path)
    assert f"{path}: generations[1].name: duplicate generation name (also generations[0]) (got \"g0\")" in message


def test_partial_backfill_without_budget(tmp_path):
    path = write(tmp_path, VALID + "    backfill: {policy: partial, order: uncertainty}\n")
    message = errors_of(path)
    assert message == (
        f"{path}: generations[1].backfill.budget: policy 'partial' needs a budget: a fraction in (0, 1] "
        "of the items or shards [line 10]"
    )


def test_budget_out_of_range(tmp_path):
    path = write(tmp_path, VALID + "    backfill: {policy: partial, budget: 1.5}\n")
    message = errors_of(path)
    assert f"{path}: generations[1].backfill.budget: Input should be less than or equal to 1 (got 1.5)" in message


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = write(tmp_path, VALID.replace("{name: hbct, params: {lam: 0.3}}", "{name: hbct, params: {lam: 0.3}"))
    message = errors_of(path)
    assert message.startswith(f"{path}: line 10, column 1: YAML syntax error: ")
    assert "started at line 9" in message


def test_yaml_tab_indentation_error(tmp_path):
    path = write(tmp_path, VALID + "\tbackfill: {policy: none}\n")
    assert errors_of(path).startswith(f"{path}: line 10, column 1: YAML syntax error: found character '\\t'")


def test_duplicate_yaml_key_is_not_silently_dropped(tmp_path):
    path = write(tmp_path, VALID.replace("data: {source: digits}", "data: {source: digits}\nname: u"))
    assert errors_of(path) == f"{path}: name: duplicate key (also at line 1; YAML would keep only the last value) [line 3]"


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "pipelines" / "missing.yaml"
    message = errors_of(path)
    assert message.startswith(f"{path}: file not found")


def test_not_a_mapping_and_empty(tmp_path):
    assert "expected a mapping of pipeline fields" in errors_of(write(tmp_path, "- a\n- b\n"))
    assert "got an empty file" in errors_of(write(tmp_path, "", name="empty.yaml"))


def test_missing_required_field(tmp_path):
    path = write(tmp_path, VALID.replace("data: {source: digits}\n", ""))
    assert errors_of(path) == f"{path}: data: Field required"


def test_all_problems_are_reported_one_per_line(tmp_path):
    path = write(tmp_path, VALID.replace("lam: 0.3", "lam: -1").replace("clip: 1.0", "clip: 0") + "    extra: 1\n")
    lines = errors_of(path).splitlines()
    assert len(lines) == 3
    assert any("generations[0].method.params.clip: Input should be greater than 0 (got 0)" in line for line in lines)
    assert any("generations[1].method.params.lam:" in line for line in lines)
    assert any("generations[1].extra: unknown field" in line for line in lines)


def test_class_selection_errors(tmp_path):
    message = errors_of(write(tmp_path, VALID.replace("{first_fraction: 0.5}", "[1, 2, -1]")))
    assert "generations[0].classes[2]: Input should be greater than or equal to 0 (got -1)" in message
    message = errors_of(write(tmp_path, VALID.replace("{first_fraction: 0.5}", "{task: 2}")))
    assert "generations[0].classes.task: a task selection needs data.task_splits" in message
    message = errors_of(write(tmp_path, VALID.replace("{first_fraction: 0.5}", "{task: 0}")))
    assert "generations[0].classes.task: Input should be greater than or equal to 1 (got 0)" in message
    message = errors_of(write(tmp_path, VALID.replace("{first_fraction: 0.5}", "{first_fraction: 0.5, task: 1}")))
    assert "generations[0].classes: give exactly one of" in message


def test_data_source_and_options(tmp_path):
    message = errors_of(write(tmp_path, VALID.replace("{source: digits}", "{source: cifar100, options: {root: x}}")))
    assert "data.options.root: unknown option of source 'cifar100'; accepted: root_or_url, label, download (got \"x\")" in message
    assert "data.options: source 'cifar100' needs the option(s) root_or_url" in message
    message = errors_of(write(tmp_path, VALID.replace("{source: digits}", "{source: digit}")))
    assert "data.source: unknown data source (did you mean 'digits'?)" in message


def test_reference_rules(tmp_path):
    message = errors_of(write(tmp_path, VALID + "evaluation: {reference: g1}\n"))
    assert "evaluation.reference: the reference φ_* is an unaligned model, but 'g1' has the parent 'g0'" in message
    message = errors_of(write(tmp_path, VALID + "evaluation: {reference: g0}\n"))
    assert "evaluation.reference: the reference is never deployed, so it cannot be a parent (of g1)" in message
    message = errors_of(write(tmp_path, VALID + "evaluation: {reference: gx}\n"))
    assert 'evaluation.reference: unknown generation; generations: g0, g1 (got "gx")' in message


def test_aligned_method_needs_a_parent(tmp_path):
    message = errors_of(write(tmp_path, VALID.replace("{name: hbct, params: {clip: 1.0}}", "{name: bct}")))
    assert "generations[0].parent: method 'bct' aligns a model to its parent: name the parent generation (got null)" in message


def test_storage_lineage_and_ray(tmp_path):
    message = errors_of(write(tmp_path, VALID + "storage: s3://bucket/runs\n"))
    assert "lineage: required with remote storage (s3://bucket/runs)" in message
    message = errors_of(write(tmp_path, VALID + "storage: hdfs://x/y\n"))
    assert "storage: unsupported storage scheme 'hdfs://'" in message
    message = errors_of(write(tmp_path, VALID + "ray: {gpus_per_worker: 1}\n"))
    assert "ray.gpus_per_worker: GPUs per worker need use_gpu: true (got 1.0)" in message


def test_replacement_and_init_from_parent(tmp_path):
    message = errors_of(write(tmp_path, VALID + "    replaces: true\n"))
    assert "generations[1].model.pretrained: a replacement (replaces: true) starts from a third-party checkpoint" in message
    message = errors_of(write(tmp_path, VALID + "    init_from_parent: true\n    model: {arch: test_convnext}\n"))
    assert "generations[1].init_from_parent: needs the parent's architecture" in message


def test_a_method_comparing_with_its_parent_needs_the_parents_embed_dim(tmp_path):
    """hbct aligns g2's embeddings to g1's: a different embed_dim is refused when the file loads,
    in one line naming the field and the value, instead of failing when g2's training starts."""
    path = PIPELINES / "lifelong.yaml"
    message = errors_of(path, {"generations.2.model.embed_dim": 64})
    assert message == (f"{path}: generations[2].model.embed_dim: method 'hbct' compares this generation's embeddings "
                       "with its parent's, so it needs the parent's embed_dim (parent 'g1': 32) (got 64) [set by override]")
    # written in the file: the line of the value
    path = write(tmp_path, VALID + "    model: {embed_dim: 64}\n")
    assert errors_of(path) == (f"{path}: generations[1].model.embed_dim: method 'hbct' compares this generation's "
                               "embeddings with its parent's, so it needs the parent's embed_dim (parent 'g0': 128) "
                               "(got 64) [line 10]")
    # independent leaves its parent out of the loss: any size
    independent = VALID.replace("{name: hbct, params: {lam: 0.3}}", "{name: independent}")
    assert load_pipeline(write(tmp_path, independent + "    model: {embed_dim: 64}\n")).generations[1].model.embed_dim == 64


def _adapter_child(method: str, embed_dim: int) -> str:
    """VALID with an independent g0 (embed_dim 128) and a ``method`` g1 of ``embed_dim``."""
    return VALID.replace("{name: hbct, params: {clip: 1.0}}", "{name: independent}").replace(
        "{name: hbct, params: {lam: 0.3}}", f"{{name: {method}}}") + f"    model: {{embed_dim: {embed_dim}}}\n"


@pytest.mark.parametrize(("method", "embed_dim"), [("fct", 64), ("fct", 256), ("lambda_orth", 256)])
def test_methods_with_adapters_between_the_two_sizes_accept_a_different_embed_dim(tmp_path, method, embed_dim):
    """fct's forward map and lambda_orth's B / F adapters map the parent's embed_dim to the child's."""
    config = load_pipeline(write(tmp_path, _adapter_child(method, embed_dim)))
    assert [g.model.embed_dim for g in config.generations] == [128, embed_dim]
    assert not config.generations[1].method.requires_parent_embed_dim


def test_a_lambda_orth_child_narrower_than_its_parent_is_refused(tmp_path):
    """Its served queries B(h) keep at most its 64 coordinates; the parent's index holds 128."""
    path = write(tmp_path, _adapter_child("lambda_orth", 64))
    assert errors_of(path) == (f"{path}: generations[1].model.embed_dim: method 'lambda_orth' maps this generation's "
                               "queries into its parent's index with at most this generation's coordinates, so it "
                               "needs at least the parent's embed_dim (parent 'g0': 128) (got 64) [line 10]")


def test_dsimplex_sizes_are_refused_at_load_where_the_fixed_classifier_cannot_hold_them():
    """The d-Simplex of K prototypes lives in R^(K−1), and every generation of the chain, a
    replacement included (task3), shares it: a replacement of another size is refused, named."""
    path = PIPELINES / "dsimplex_7task.yaml"
    message = errors_of(path, {"generations.2.method.params.num_prototypes": 512, "generations.2.model.embed_dim": 511})
    assert message.splitlines()[0] == (  # then its children, which start from it with 1023, are refused as well
        f"{path}: generations[2].model.embed_dim: method 'dsimplex' fixes the embedding's size for the whole "
        "chain, a replacement included, so it needs the parent's embed_dim (parent 'task2': 1023) (got 511) "
        "[set by override]")
    message = errors_of(path, {"generations.0.model.embed_dim": 511})
    assert message.splitlines()[0] == (f"{path}: generations[0].model.embed_dim: dsimplex needs embed_dim == "
                                       "num_prototypes - 1 = 1023 (num_prototypes 1024) (got 511) [set by override]")


def test_a_replacement_aligns_to_its_own_start_not_to_the_parents_size(tmp_path):
    """A replacement's frozen model is the checkpoint it starts from, so its size is not the parent's rule."""
    text = VALID + "    replaces: true\n    model: {embed_dim: 64, pretrained: ./weights/third_party.safetensors}\n"
    assert load_pipeline(write(tmp_path, text)).generations[1].model.embed_dim == 64


def test_direct_model_validation_summarises_nested_problems():
    """Without load_pipeline (Python API), the pydantic error still lists each problem's path."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"method\.params\n  lam: Input should be greater than or equal to 0 \(got -1\)"):
        GenerationSpec.model_validate({"name": "g", "method": {"name": "hbct", "params": {"lam": -1}}})
    with pytest.raises(ValidationError, match="duplicate generation name"):
        PipelineConfig.model_validate({"name": "p", "data": {"source": "digits"}, "generations": [
            {"name": "a", "method": {"name": "hbct"}}, {"name": "a", "method": {"name": "hbct"}}]})


def test_split_options_for_sources_without_splits(tmp_path):
    folder = VALID.replace("{source: digits}", "{source: image_folder, split_options: {train: {root: a}, tset: {root: b}}}")
    message = errors_of(write(tmp_path, folder))
    assert "data.eval_split: source 'image_folder' has no split argument: give this split's loader options" in message
    assert "(got \"test\")" in message
    fixed = folder.replace("tset", "test") + "gallery: {split: gallery}\n"
    assert "gallery.split: source 'image_folder' has no split argument" in errors_of(write(tmp_path, fixed))
    fixed = fixed.replace("test: {root: b}", "test: {root: b}, gallery: {root: c}, extra: {root: d}")
    assert errors_of(write(tmp_path, fixed)).endswith("data.split_options.extra: no split of this name is used "
                                                      "(used: gallery, test, train) [line 2]")
    assert load_pipeline(write(tmp_path, fixed.replace(", extra: {root: d}", ""))).gallery_loader_kwargs() == (
        "image_folder", {"root": "c", "image_size": 32})


def test_gallery_index_kind_and_option_names(tmp_path):
    message = errors_of(write(tmp_path, VALID + "gallery: {index: binary_flat}\n"))
    assert "gallery.index: must be one of flat, ivf, hnsw, binary," in message and '(got "binary_flat") [line 10]' in message
    message = errors_of(write(tmp_path, VALID + "gallery: {index: binary, index_options: {bits: 2, nprobe: 4}}\n"))
    assert "gallery.index_options.nprobe: is not an option of index 'binary' (its options: bits, clip_percentile)" in message
    assert "bits" not in message.split("nprobe")[0]  # the valid option is not reported
    config = load_pipeline(write(tmp_path, VALID + "gallery: {index: binary_weighted, index_options: {bits: 3}}\n", "ok.yaml"))
    assert config.gallery.index == "binary_weighted" and config.gallery.index_options == {"bits": 3}


def test_an_uncertainty_order_needs_hyperbolic_generations_before_it():
    """The Euclidean pipeline shipped g1 with `order: uncertainty` over g0-old's cosine shards: the
    plan failed after g0-old and g1 had trained and g0-old was deployed. Now the file is refused
    in one line; in the hyperbolic default the same order loads."""
    path = PIPELINES / "lifelong_euclidean.yaml"
    assert errors_of(path, {"generations.1.backfill.order": "uncertainty"}) == (
        f"{path}: generations[1].backfill.order: needs hyperbolic (Lorentz) embeddings in the gallery, but "
        "'g0-old' (independent, space cosine) serves before it; use class_mean_distance, least_compatible or random "
        "(got \"uncertainty\") [set by override]")
    assert load_pipeline(path).generation("g1").backfill.order == "class_mean_distance"
    assert load_pipeline(PIPELINES / "lifelong.yaml").generation("g1").backfill.order == "uncertainty"


def test_the_actor_pools_writers_setting_names_its_replacement(tmp_path):
    path = write(tmp_path, VALID + "gallery: {embedding: {concurrency: 2, num_gpus: 1, writers: 8}}\n")
    message = errors_of(path)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"{path}: gallery.embedding.writers: was removed: the gallery step runs on Ray Data")
    assert "concurrency (and max_concurrency to autoscale)" in message and "(got 8)" in message


def test_an_autoscaling_pool_has_a_least_size_below_its_largest(tmp_path):
    assert load_pipeline(write(tmp_path, VALID + "gallery: {embedding: {concurrency: 2, max_concurrency: 6}}\n",
                               "pool.yaml")).gallery.embedding.pool_size == (2, 6)
    message = errors_of(write(tmp_path, VALID + "gallery: {embedding: {concurrency: 4, max_concurrency: 2}}\n"))
    assert "gallery.embedding.max_concurrency: at least concurrency (4) (got 2)" in message


def test_the_read_task_size_is_a_positive_row_count(tmp_path):
    assert load_pipeline(write(tmp_path, VALID + "gallery: {embedding: {rows_per_task: 262144}}\n", "tasks.yaml")
                         ).gallery.embedding.rows_per_task == 262144
    message = errors_of(write(tmp_path, VALID + "gallery: {embedding: {rows_per_task: 0}}\n"))
    assert len(message.splitlines()) == 1
    assert "gallery.embedding.rows_per_task: " in message and "(got 0)" in message


def test_where_ray_datas_executor_runs_is_auto_by_the_steps_items_or_as_set(tmp_path):
    from orchestrator.config.gallery import COORDINATOR_FROM_ITEMS

    auto = load_pipeline(write(tmp_path, VALID, "auto.yaml")).gallery.embedding
    assert auto.executor == "auto"
    assert [auto.executor_for(n) for n in (1, COORDINATOR_FROM_ITEMS - 1, COORDINATOR_FROM_ITEMS, 10**9)] == \
        ["driver", "driver", "coordinator", "coordinator"]
    for where in ("driver", "coordinator"):
        spec = load_pipeline(write(tmp_path, VALID + f"gallery: {{embedding: {{executor: {where}}}}}\n",
                                   f"{where}.yaml")).gallery.embedding
        assert {spec.executor_for(n) for n in (1, 10**9)} == {where}
    message = errors_of(write(tmp_path, VALID + "gallery: {embedding: {executor: head}}\n"))
    assert len(message.splitlines()) == 1
    assert "gallery.embedding.executor: " in message and '(got "head")' in message, message
