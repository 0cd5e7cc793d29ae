"""``evaluate:<gen>`` embeds the evaluation sample once per generation over a lineage (T passes,
not T(T+1)/2), stores the embeddings (sha256 checked on read) and gives the numbers the previous
implementation gave, which embedded the split with every generation at every evaluation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from image_data import LabelShiftedImages
from orchestrator.comparison import IncomparableGenerations, comparison_path
from orchestrator.config import EvaluationSpec, load_pipeline
from orchestrator.data import load_digits
from orchestrator.evaluation import compare_generations, embed_split, evaluate_generations, sample_split
from orchestrator.integrity import trained_outputs
from orchestrator.lineage.step_keys import evaluate_key, train_key
from orchestrator.methods import create_method
from orchestrator.methods.base import embed_dataset_with_ids
from orchestrator.methods.fct import build_forward_map
from orchestrator.methods.lambda_orth import BACKWARD_ADAPTER, FORWARD_ADAPTER, build_adapters
from orchestrator.metrics import METRICS, retrieval_metrics
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.pipeline.evaluate_step import (
    EVAL_EMBEDDINGS,
    eval_embeddings_uri,
    evaluate_once,
    read_split_embeddings,
    recorded_embeddings,
)
from orchestrator.pipeline.runner import PipelineRunner
from orchestrator.pipeline.step_specs import ChangedStepSpec, evaluate_spec
from orchestrator.storage import ChecksumMismatch

ENCODER = EncoderConfig(arch="test_resnet", embed_dim=8)
NAMES = ["g0", "g1", "g2"]
PARENTS = {"g1": "g0", "g2": "g1"}
#: lineage kind → method of every generation; the children carry the method's maps
LINEAGES = {"direct": "hbct", "adapter": "lambda_orth", "forward": "fct"}


def tiny_model(method_name: str, seed: int, child: bool) -> CompatibleModel:
    """An untrained 8-dimensional model; a λ-orth child gets B and F, an FCT child a lone F (all
    perturbed away from their identity initialisation)."""
    torch.manual_seed(seed)
    model = create_method(method_name, {}).build_model(ENCODER, num_classes=4, seen_classes=range(4))
    if child and method_name == "lambda_orth":
        backward, forward = build_adapters(8, 8, "orthogonal", True)
        model.adapters[BACKWARD_ADAPTER], model.adapters[FORWARD_ADAPTER] = backward, forward
    if child and method_name == "fct":
        model.adapters[FORWARD_ADAPTER] = build_forward_map(8, 8, "mlp", 16, True)
    with torch.no_grad():
        for parameter in model.adapters.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


def lineage(kind: str) -> dict[str, CompatibleModel]:
    return {name: tiny_model(LINEAGES[kind], seed, child=seed > 0) for seed, name in enumerate(NAMES)}


@pytest.fixture
def forwards(monkeypatch) -> dict[int, int]:
    """id(model) → items passed through its forward (every CompatibleModel, however called)."""
    counts: dict[int, int] = {}
    original = CompatibleModel.forward

    def counting(self, images):
        counts[id(self)] = counts.get(id(self), 0) + int(images.shape[0])
        return original(self, images)

    monkeypatch.setattr(CompatibleModel, "forward", counting)
    return counts


def evaluate_lineage(models, data, tmp_path):
    """``evaluate_once`` of every generation in order, as the pipeline runs them: (reports, records)."""
    reports, records = {}, {}
    for t, name in enumerate(NAMES):
        upto = {other: models[other] for other in NAMES[: t + 1]}
        stored = {other: records[other] for other in NAMES[:t]}
        reports[name], records[name] = evaluate_once(name, upto, data, PARENTS, stored,
                                                     eval_embeddings_uri(str(tmp_path), name, "test"))
    return reports, records


def previous_row(models, data, query: str) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """The previous implementation's cells of ``query``'s row, written out: every generation up to
    ``query`` embeds ``data`` again, each pair is aligned along its comparison path and ranked."""
    embedded, labels, ids = {}, None, None
    for name, model in models.items():
        out, labels, ids = embed_dataset_with_ids(model, data)
        embedded[name] = out.embedding
    cells, notes = {}, {}
    for gallery in models:
        try:
            path = comparison_path(query, gallery, models, PARENTS)
            queries, items = path.align(embedded[query], embedded[gallery])
        except IncomparableGenerations as reason:
            notes[gallery] = reason.reason
            continue
        result = retrieval_metrics(queries, items, labels, labels, path.space, curv=path.curv,
                                   query_ids=ids, gallery_ids=ids)
        cells[gallery] = {"cmc@1": result.cmc[1], "cmc@5": result.cmc[5], "map": result.mean_ap}
    return cells, notes


@pytest.mark.parametrize("kind", sorted(LINEAGES))
def test_each_generation_embeds_once_and_the_cells_equal_the_previous_implementation(kind, tmp_path, forwards):
    models = lineage(kind)
    data = LabelShiftedImages(n=40, num_classes=4, seed=1, shift=0.5, id_offset=100)
    reports, _records = evaluate_lineage(models, data, tmp_path)
    assert {name: forwards.get(id(models[name])) for name in NAMES} == {name: len(data) for name in NAMES}  # 3N

    forwards.clear()  # the previous implementation: every evaluation re-embeds every earlier generation
    expected = {query: previous_row({n: models[n] for n in NAMES[: t + 1]}, data, query) for t, query in enumerate(NAMES)}
    assert sum(forwards.values()) == 6 * len(data)
    for query, (cells, notes) in expected.items():
        report = reports[query]
        for gallery in NAMES[: NAMES.index(query) + 1]:
            if gallery in notes:
                assert report.notes[(query, gallery)] == notes[gallery]
                assert all(math.isnan(report.value(query, gallery, m)) for m in METRICS)
                continue
            for metric in METRICS:
                assert abs(report.value(query, gallery, metric) - cells[gallery][metric]) <= 1e-6, (query, gallery, metric)
    assert all(not notes for _cells, notes in expected.values())  # every pair of these lineages is comparable
    if kind != "direct":  # the two-hop cell goes through a chain of two adapters / maps
        assert "chain of 2" in reports["g2"].notes[("g2", "g0")]


def test_evaluate_generations_embeds_each_model_once_and_fills_every_row(forwards):
    models = lineage("adapter")
    data = LabelShiftedImages(n=24, num_classes=4, seed=2, shift=0.5, id_offset=7)
    report = evaluate_generations(models, data, parents=PARENTS)
    assert sorted(forwards.values()) == [len(data)] * 3
    cells, _notes = previous_row(models, data, "g2")
    assert report.value("g2", "g0", "map") == pytest.approx(cells["g0"]["map"], abs=1e-6)


def test_stored_embeddings_are_checked_and_a_changed_file_is_named(tmp_path):
    models = lineage("direct")
    data = LabelShiftedImages(n=16, num_classes=4, seed=3, shift=0.5, id_offset=0)
    _reports, records = evaluate_lineage(models, data, tmp_path)
    stored = read_split_embeddings(records["g1"])
    expected, labels, ids = embed_dataset_with_ids(models["g1"], data)
    assert torch.equal(stored.embedding, expected.embedding) and torch.equal(stored.ids, ids)
    assert records["g1"]["uri"].endswith("generations/g1/eval-test.safetensors") and records["g1"]["items"] == 16

    with open(records["g0"]["uri"], "r+b") as handle:  # one byte changed in g0's stored file
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 1]))
    with pytest.raises(ChecksumMismatch, match=r"eval-test\.safetensors"):
        evaluate_once("g1", {n: models[n] for n in NAMES[:2]}, data, PARENTS, {"g0": records["g0"]},
                      eval_embeddings_uri(str(tmp_path), "g1", "test"))
    with pytest.raises(ValueError, match=r"step 'evaluate:g0' has not committed"):
        recorded_embeddings(None, "evaluate:g0")
    with pytest.raises(ValueError, match=r"step 'evaluate:g0' recorded no evaluation embeddings"):
        recorded_embeddings({"pairs": 1}, "evaluate:g0")


def test_the_eval_sample_is_class_stratified_seeded_and_bounded():
    digits = load_digits("test")
    assert sample_split(digits, None) is digits and sample_split(digits, 10_000) is digits  # all 539
    sample = sample_split(digits, 100)
    assert len(sample) == 100 and np.array_equal(sample.ids, sample_split(digits, 100).ids)
    assert np.all(np.abs(np.bincount(sample.labels) - 100 * np.bincount(digits.labels) / len(digits)) <= 1)
    positions = [int(np.flatnonzero(digits.ids == item)[0]) for item in sample.ids]
    assert positions == sorted(positions)  # in split order
    with pytest.raises(ValueError, match="eval_sample"):
        load_pipeline("pipelines/lifelong.yaml", {"evaluation.eval_sample": 5})
    with pytest.raises(ValueError, match="eval_sample"):
        load_pipeline("pipelines/lifelong.yaml", {"evaluation.eval_sample": 10**10})
    assert EvaluationSpec.model_validate({"eval_sample": None}).eval_sample is None  # the whole split


def _runner(tmp_path, **overrides) -> PipelineRunner:
    overrides = {"storage": str(tmp_path / "run"), "lineage": f"sqlite:///{tmp_path / 'lineage.db'}",
                 "evaluation.eval_sample": 60, **overrides}
    return PipelineRunner(load_pipeline("pipelines/lifelong.yaml", overrides), progress=lambda line: None)


def test_the_pipeline_evaluates_a_lineage_with_one_pass_per_generation(tmp_path, forwards):
    runner = _runner(tmp_path)
    lineage_specs = [g for g in runner.config.generations if g.name in ("g0-old", "g1", "g2")]
    for seed, generation in enumerate(lineage_specs):
        method = create_method("hbct", {})
        torch.manual_seed(seed)
        model = method.build_model(ENCODER, 10, range(10))
        uri = runner.generation_uri(generation.name)
        card = save_generation(model, method, None, uri, name=generation.name, parent=generation.parent)
        runner.store.upsert_generation(generation.name, parent=generation.parent, method="hbct")
        runner.store.mark_generation_trained(generation.name, uri, card.sha256, step=train_key(generation.name),
                                             step_outputs=trained_outputs(uri, card.sha256))
    for generation in lineage_specs:
        runner._step(evaluate_key(generation.name), lambda key, g=generation: runner._evaluate(g, key),
                     evaluate_spec(runner.config), generation.name)
    assert sorted(forwards.values()) == [60, 60, 60]  # 3N forward items, not 6N

    outputs = {g.name: runner.store.committed_outputs(evaluate_key(g.name)) for g in lineage_specs}
    assert [outputs[name]["pairs"] for name in outputs] == [1, 2, 3]
    assert outputs["g2"][EVAL_EMBEDDINGS]["uri"] == eval_embeddings_uri(runner.storage, "g2", "test")
    stored = read_split_embeddings(outputs["g0-old"][EVAL_EMBEDDINGS])
    sample = sample_split(runner.eval_images, 60)
    assert torch.equal(stored.ids, torch.from_numpy(sample.ids))
    pairs = {(v.query, v.gallery) for v in runner.store.compatibility_values(dataset="test")}
    assert pairs == {("g0-old", "g0-old"), ("g1", "g0-old"), ("g1", "g1"), ("g2", "g0-old"), ("g2", "g1"), ("g2", "g2")}

    with pytest.raises(ChangedStepSpec, match=r"evaluation\.eval_sample \(60 → 80\)"):
        changed = _runner(tmp_path, **{"evaluation.eval_sample": 80})
        changed._step("evaluate:g0-old", lambda key: None, evaluate_spec(changed.config), "g0-old")



def test_compare_generations_refuses_embeddings_of_other_items_or_none():
    models = lineage("direct")
    data = LabelShiftedImages(n=12, num_classes=4, seed=4, shift=0.5, id_offset=0)
    other = LabelShiftedImages(n=12, num_classes=4, seed=4, shift=0.5, id_offset=50)
    embedded = {"g0": embed_split(models["g0"], data), "g1": embed_split(models["g1"], other)}
    with pytest.raises(ValueError, match="generation 'g1''s embeddings cover other items than generation 'g0'"):
        compare_generations({n: models[n] for n in NAMES[:2]}, embedded, PARENTS)
    with pytest.raises(ValueError, match="no embeddings given for generation.s. g2"):
        compare_generations(models, embedded, PARENTS, queries=["g2"])
    with pytest.raises(ValueError, match="query generation.s. g9 not among the models"):
        compare_generations(models, embedded, PARENTS, queries=["g9"])
