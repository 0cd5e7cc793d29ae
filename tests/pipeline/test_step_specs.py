"""Committed steps record what they ran from; a re-run whose file says otherwise is refused with
the changed fields named, and settings that cannot change results do not count."""
from __future__ import annotations

import pytest

from orchestrator.config import BackfillPolicy, load_pipeline
from orchestrator.lineage.step_keys import train_key
from orchestrator.pipeline.runner import PipelineRunner
from orchestrator.pipeline.step_specs import ChangedStepSpec, changed_fields, plan_spec, recorded_spec, train_spec


def runner(tmp_path, **overrides) -> PipelineRunner:
    overrides = {"storage": str(tmp_path / "run"), "lineage": f"sqlite:///{tmp_path / 'lineage.db'}", **overrides}
    return PipelineRunner(load_pipeline("pipelines/lifelong.yaml", overrides), progress=lambda line: None)


def run_train_step(r: PipelineRunner, index: int = 1) -> bool:
    generation = r.config.generations[index]
    return r._step(train_key(generation.name), lambda key: r.store.commit_step(key, {"done": True}),
                   train_spec(r.config, generation, "parent-sha"), generation.name)


def test_changed_fields_name_every_differing_leaf():
    old = {"generation": {"method": {"params": {"clip": 1.2}}, "training": {"epochs": 20}}, "parent_sha256": "a"}
    new = {"generation": {"method": {"params": {"clip": 1.4, "lam": 1}}, "training": {"epochs": 20}}, "parent_sha256": "b"}
    assert changed_fields(old, new) == ["generation.method.params.clip (1.2 → 1.4)", "generation.method.params.lam",
                                        "parent_sha256 ('a' → 'b')"]
    assert changed_fields(old, old) == []


def test_a_committed_step_with_another_spec_is_refused_and_the_same_one_skipped(tmp_path):
    assert run_train_step(runner(tmp_path)) is True
    assert run_train_step(runner(tmp_path)) is False  # same file: skipped
    assert run_train_step(runner(tmp_path, **{"ray.num_workers": 2, "gallery.embedding.batch_size": 7,
                                              "generations.1.gate.action": "force"})) is False  # no result changes
    with pytest.raises(ChangedStepSpec) as refused:
        run_train_step(runner(tmp_path, **{"generations.1.method.params.clip": 1.5, "data.image_size": 28}))
    assert refused.value.key == "train:g1"
    assert refused.value.fields == ["data.image_size (32 → 28)", "generation.method.params.clip (1.2 → 1.5)"]
    recorded = runner(tmp_path).store.committed_outputs("train:g1")
    assert recorded["done"] is True and recorded["spec"]["generation"]["name"] == "g1"  # outputs kept


def test_the_scenario_label_does_not_count_even_in_a_spec_recorded_with_it(tmp_path):
    first = runner(tmp_path)
    assert run_train_step(first) is True
    assert run_train_step(runner(tmp_path, **{"data.scenario": "extended_class"})) is False  # a label: skipped
    # a lineage written when the scenario was part of the spec still resumes
    spec = first.store.committed_outputs("train:g1")["spec"]
    older = {**spec, "data": {**spec["data"], "scenario": "both"}}
    assert changed_fields(recorded_spec(older, spec), spec) == [] and changed_fields(older, spec) == ["data.scenario"]


def test_a_method_parameter_added_since_at_its_default_is_not_a_change(tmp_path):
    first = runner(tmp_path)
    assert run_train_step(first) is True
    spec = first.store.committed_outputs("train:g1")["spec"]
    params = spec["generation"]["method"]["params"]
    # recorded today with every parameter, defaults included (g1 sets neither of these two)
    assert (params["mlr_init_scale"], params["lam_warmup"]) == (1.0, 0.0)
    older = {**spec, "generation": {**spec["generation"], "method": {
        "name": "hbct", "params": {k: v for k, v in params.items() if k not in ("mlr_init_scale", "lam_warmup")}}}}
    assert changed_fields(older, spec) == ["generation.method.params.lam_warmup",
                                           "generation.method.params.mlr_init_scale"]
    assert changed_fields(recorded_spec(older, spec), spec) == []  # as written before the parameters existed
    edited = {**older, "generation": {**older["generation"], "method": {
        "name": "hbct", "params": {**older["generation"]["method"]["params"], "lam": 0.5}}}}
    assert changed_fields(recorded_spec(edited, spec), spec) == ["generation.method.params.lam (0.5 → 0.3)"]
    unknown = {**older, "generation": {**older["generation"], "retired_field": 1}}
    assert "generation.retired_field" in changed_fields(recorded_spec(unknown, spec), spec)  # compared as recorded


def test_a_plan_spec_recorded_before_a_backfill_setting_existed_reads_it_at_its_default(tmp_path):
    config = runner(tmp_path).config
    spec = plan_spec(config, config.generations[1])  # g1: partial, 0.5 of the items, uncertainty order
    assert spec["backfill"]["budget_unit"] == BackfillPolicy().budget_unit == "items"
    older = {**spec, "backfill": {k: v for k, v in spec["backfill"].items() if k != "budget_unit"}}
    assert changed_fields(recorded_spec(older, spec), spec) == []  # missing: read at its default, as used then
    other = {**older, "backfill": {**older["backfill"], "order": "random"}}
    assert changed_fields(recorded_spec(other, spec), spec) == ["backfill.order ('random' → 'uncertainty')"]
def test_the_plan_spec_covers_the_gallery_and_the_backfill_policy_only(tmp_path):
    base = runner(tmp_path).config
    changed = runner(tmp_path, **{"generations.1.backfill.budget": 0.25, "gallery.embedding.concurrency": 2}).config
    fields = changed_fields(plan_spec(base, base.generations[1]), plan_spec(changed, changed.generations[1]))
    assert fields == ["backfill.budget (0.5 → 0.25)"]


def test_a_generation_whose_method_parameters_are_left_out_is_skipped_on_a_rerun(tmp_path):
    # the phi-star of the default file names its method without parameters; they are completed
    # when the file is read, as they are when a recorded spec is read again: nothing changed
    r = runner(tmp_path, **{"generations.3.method": {"name": "independent"}})
    phi_star = r.config.generations[3]
    assert phi_star.method.params == {"space": "cosine", "curv": 1.0, "clip": 1.0}
    assert run_train_step(r, 3) is True
    assert run_train_step(r, 3) is False  # skipped, not refused as changed
