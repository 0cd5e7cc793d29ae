"""FCT learned on the bundled digits: the old gallery mapped by F is searchable by the new model.

The old model is trained on classes 0-4, the ``fct`` model on all ten (12 epochs; both from the
session's shared experiment, ``conftest.update``); F (the default 2-layer MLP) is fitted on the
training set.
The compatibility evaluation computes the cross cell as F(φ_old)/φ_new, which must beat the old
model's self-test (the empirical criterion) and equal a ranking computed here by applying F's
weights by hand; the raw φ_new/φ_old pair is refused, and it would indeed be meaningless.

Seed 0, measured when written: mAP F(φ_old)/φ_new 0.938 vs old self 0.625 (CMC@1 0.983 vs
0.809), new self 0.987 (CMC@1 0.991); raw φ_new/φ_old, computed by hand, 0.086 (CMC@1 0.076).
"""
from __future__ import annotations

import pytest
import torch

from orchestrator.comparison import IncomparableGenerations, comparison_path
from orchestrator.methods.base import embed_dataset_with_ids
from orchestrator.metrics import retrieval_metrics

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fct_update(digits_experiment, update):
    """(experiment, models {"old", "fct"}, parents, report) from the session's shared experiment
    (``conftest.update``): ``fct`` and the old model it was aligned to, renamed."""
    old_name = update.generations["fct"][0]
    models = {"old": update.models[old_name], "fct": update.models["fct"]}
    parents = {"fct": "old"}
    return digits_experiment, models, parents, digits_experiment.evaluate(models, parents)


def test_the_old_gallery_mapped_by_f_beats_the_old_self_test(fct_update):
    _experiment, _models, _parents, report = fct_update
    assert report.notes[("fct", "old")] == "gallery mapped by the forward map F"
    for metric in ("map", "cmc@1"):
        summary = report.compatibility("old", "fct", metric=metric)
        assert summary["compatible"], summary
        assert summary["cross"] > summary["old_self"] + 0.1
    assert report.value("fct", "fct", "cmc@1") > 0.95


def test_the_cross_cell_equals_a_ranking_of_the_gallery_mapped_by_hand(fct_update):
    experiment, models, _parents, report = fct_update
    data = experiment.dataset(experiment.eval_images)
    old_out, labels, ids = embed_dataset_with_ids(models["old"], data)
    new_out, _labels, _ids = embed_dataset_with_ids(models["fct"], data)
    old_emb, new_emb = old_out.embedding.double(), new_out.embedding.double()
    mlp = models["fct"].adapters["forward_map"].map
    w1, b1, w2, b2 = (p.detach().double() for p in (mlp.hidden.weight, mlp.hidden.bias, mlp.output.weight, mlp.output.bias))
    mapped = torch.clamp((old_emb / old_emb.norm(dim=1, keepdim=True)) @ w1.T + b1, min=0) @ w2.T + b2
    expected = retrieval_metrics(new_emb, mapped, labels, labels, "cosine", ks=(1, 5), query_ids=ids, gallery_ids=ids)
    assert report.value("fct", "old", "map") == pytest.approx(expected.mean_ap, abs=1e-6)
    assert report.value("fct", "old", "cmc@1") == pytest.approx(expected.cmc[1], abs=1e-6)
    # the raw pair would be meaningless (independently trained spaces) ...
    raw = retrieval_metrics(new_emb, old_emb, labels, labels, "cosine", query_ids=ids, gallery_ids=ids)
    assert raw.mean_ap < report.value("old", "old", "map") - 0.3


def test_the_raw_pair_is_refused_rather_than_computed(fct_update):
    _experiment, models, parents, _report = fct_update
    # ... and is refused: the old model's queries over the new gallery, and the pair without the lineage
    for query, gallery, lineage in (("old", "fct", parents), ("fct", "old", {})):
        with pytest.raises(IncomparableGenerations, match="'fct' was trained independently"):
            comparison_path(query, gallery, models, lineage)
