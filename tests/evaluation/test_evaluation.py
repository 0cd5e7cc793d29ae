"""evaluate_generations assembles the right retrieval numbers for every pair."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from image_data import LabelShiftedImages
from orchestrator.evaluation import evaluate_generations
from orchestrator.methods import create_method, embed_dataset
from orchestrator.metrics import retrieval_metrics
from orchestrator.models.encoder import EncoderConfig


def random_images(n: int = 40, classes: int = 4, seed: int = 0) -> LabelShiftedImages:
    return LabelShiftedImages(n=n, num_classes=classes, seed=seed, shift=0.0, id_offset=100)


def tiny_model(method_name: str, params=None, seed: int = 0):
    torch.manual_seed(seed)
    method = create_method(method_name, params)
    config = EncoderConfig(arch="test_resnet", embed_dim=8)
    return method.build_model(config, num_classes=4, seen_classes=range(4)).eval()


def test_every_pair_equals_a_direct_retrieval_computation():
    data = random_images()
    models = {"old": tiny_model("independent", seed=1), "new": tiny_model("independent", seed=2)}
    report = evaluate_generations(models, data)
    embeddings = {name: embed_dataset(model, data)[0].embedding for name, model in models.items()}
    for query, gallery in [("old", "old"), ("new", "old"), ("new", "new")]:
        expected = retrieval_metrics(embeddings[query], embeddings[gallery], data.labels, data.labels,
                                     "cosine", query_ids=data.ids, gallery_ids=data.ids)
        assert report.value(query, gallery, "cmc@1") == pytest.approx(expected.cmc[1])
        assert report.value(query, gallery, "cmc@5") == pytest.approx(expected.cmc[5])
        assert report.value(query, gallery, "map") == pytest.approx(expected.mean_ap)
    assert math.isnan(report.value("old", "new"))  # newer galleries are never searched by older queries
    assert [(r["query"], r["gallery"]) for r in report.rows()] == [("old", "old"), ("new", "old"), ("new", "new")]


def test_leave_one_out_uses_item_ids():
    # Two identical models: without leave-one-out every query would find itself at rank 1.
    data = random_images(n=24, classes=12)  # 2 items per class
    model = tiny_model("independent", seed=3)
    report = evaluate_generations({"a": model}, data)
    out = embed_dataset(model, data)[0].embedding
    expected = retrieval_metrics(out, out, data.labels, data.labels, "cosine", query_ids=data.ids, gallery_ids=data.ids)
    assert report.value("a", "a", "cmc@1") == pytest.approx(expected.cmc[1])
    assert report.value("a", "a", "cmc@1") < 1.0


def test_pairs_without_a_common_distance_are_left_empty_with_a_note():
    data = random_images()
    models = {"cos": tiny_model("independent", seed=1), "hyp": tiny_model("hbct", seed=2)}
    report = evaluate_generations(models, data)
    assert math.isnan(report.value("hyp", "cos"))
    assert "no common distance" in report.notes[("hyp", "cos")]
    assert not math.isnan(report.value("hyp", "hyp"))


def test_backward_adapter_maps_queries_into_the_parent_space():
    data = random_images()
    old, new = tiny_model("independent", seed=1), tiny_model("independent", seed=2)
    permutation = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    mapping = nn.Linear(8, 8, bias=False)
    with torch.no_grad():
        mapping.weight.copy_(torch.eye(8)[permutation])
    new.adapters["backward"] = mapping
    report = evaluate_generations({"old": old, "new": new}, data, parents={"new": "old"})
    queries = embed_dataset(new, data)[0].embedding @ torch.eye(8)[permutation].T
    gallery = embed_dataset(old, data)[0].embedding
    expected = retrieval_metrics(queries, gallery, data.labels, data.labels, "cosine",
                                 query_ids=data.ids, gallery_ids=data.ids)
    assert report.value("new", "old", "map") == pytest.approx(expected.mean_ap)
    assert report.notes[("new", "old")] == "queries mapped by the backward adapter"


def test_compatibility_summary_uses_the_reference_and_the_table_form_of_p_up():
    data = random_images()
    models = {"old": tiny_model("independent", seed=1), "ref": tiny_model("independent", seed=2),
              "new": tiny_model("independent", seed=3)}
    report = evaluate_generations(models, data)
    summary = report.compatibility("old", "new", reference="ref", metric="map")
    old_self, ref_self = report.value("old", "old", "map"), report.value("ref", "ref", "map")
    cross, new_self = report.value("new", "old", "map"), report.value("new", "new", "map")
    assert summary["p_com"] == pytest.approx((cross - old_self) / (ref_self - old_self))
    assert summary["p_up"] == pytest.approx((new_self - ref_self) / ref_self)
    assert summary["compatible"] is (cross > old_self)
    assert np.isfinite(summary["p_com"])


def test_no_models_is_an_error():
    with pytest.raises(ValueError, match="no models"):
        evaluate_generations({}, random_images())


def test_an_fct_cross_cell_is_the_old_gallery_mapped_by_f_and_the_raw_pair_is_refused():
    from orchestrator.methods.fct import build_forward_map

    data = random_images()
    models = {"old": tiny_model("independent", seed=1), "new": tiny_model("fct", seed=2)}
    torch.manual_seed(3)
    forward = models["new"].adapters["forward_map"] = build_forward_map(8, 8, "mlp", 16, True)
    report = evaluate_generations(models, data, parents={"new": "old"})
    old_emb, new_emb = (embed_dataset(models[name], data)[0].embedding for name in ("old", "new"))
    unit = old_emb / old_emb.norm(dim=1, keepdim=True)
    hidden = torch.clamp(unit @ forward.map.hidden.weight.detach().T + forward.map.hidden.bias.detach(), min=0)
    mapped = hidden @ forward.map.output.weight.detach().T + forward.map.output.bias.detach()
    expected = retrieval_metrics(new_emb, mapped, data.labels, data.labels, "cosine", query_ids=data.ids, gallery_ids=data.ids)
    assert report.value("new", "old", "cmc@1") == pytest.approx(expected.cmc[1])
    assert report.value("new", "old", "map") == pytest.approx(expected.mean_ap)
    assert report.notes[("new", "old")] == "gallery mapped by the forward map F"
    # without the lineage, the FCT generation's raw embeddings are not compared with the old ones
    report = evaluate_generations(models, data)
    assert math.isnan(report.value("new", "old")) and "trained independently" in report.notes[("new", "old")]
