"""Training-free spherical interpolation (methods/posthoc.py ``Slerp``, models/adapters/posthoc.py
``spherical_interpolation``, ``QueryInterpolation``): the slerp formula against an independent numpy
computation, its end points and unit norm, the Procrustes part against numpy's SVD, the fit on a
frozen given encoder, and the comparison path that hands the parent's query embeddings to it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrator.comparison import MissingQueryEmbeddings, comparison_path
from orchestrator.methods import create_method
from orchestrator.methods.base import TrainContext
from orchestrator.models.adapters import (
    BACKWARD_ADAPTER,
    AffineAdapter,
    ChartMap,
    QueryInterpolation,
    adapter_spec,
    build_adapter,
    spherical_interpolation,
)
from orchestrator.training.loop import freeze
from vector_models import vector_model


def numpy_slerp(a: np.ndarray, b: np.ndarray, t: float) -> np.ndarray:
    """Row-wise slerp by the textbook formula, written independently: Shoemake's great-circle point."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    out = np.empty_like(a)
    for i in range(len(a)):
        theta = np.arccos(np.clip(a[i] @ b[i], -1.0, 1.0))
        out[i] = (np.sin((1 - t) * theta) * a[i] + np.sin(t * theta) * b[i]) / np.sin(theta)
    return out


@pytest.mark.parametrize("t", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_spherical_interpolation_is_the_slerp_formula(t):
    rng = np.random.default_rng(int(t * 10))
    a, b = rng.standard_normal((40, 7)) * 3, rng.standard_normal((40, 7)) * 0.5
    got = spherical_interpolation(torch.from_numpy(a), torch.from_numpy(b), t).numpy()
    np.testing.assert_allclose(got, numpy_slerp(a, b, t), atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-12)
    unit_a = a / np.linalg.norm(a, axis=1, keepdims=True)
    unit_b = b / np.linalg.norm(b, axis=1, keepdims=True)
    if t == 0.0:
        np.testing.assert_allclose(got, unit_a, atol=1e-12)
    if t == 1.0:
        np.testing.assert_allclose(got, unit_b, atol=1e-12)
    # on the great circle: the angle to a is t θ, the angle to b (1 − t) θ
    theta = np.arccos(np.clip(np.sum(unit_a * unit_b, axis=1), -1, 1))
    np.testing.assert_allclose(np.arccos(np.clip(np.sum(got * unit_a, axis=1), -1, 1)), t * theta, atol=1e-6)
    np.testing.assert_allclose(np.arccos(np.clip(np.sum(got * unit_b, axis=1), -1, 1)), (1 - t) * theta, atol=1e-6)


def test_spherical_interpolation_of_parallel_rows_stays_finite():
    a = torch.tensor([[1.0, 2.0, 2.0], [0.0, 3.0, 4.0]], dtype=torch.float64)
    got = spherical_interpolation(a, 2 * a, 0.3)
    torch.testing.assert_close(got, a / a.norm(dim=1, keepdim=True))
    with pytest.raises(ValueError, match="one shape"):
        spherical_interpolation(a, a[:, :2], 0.3)


def _fitted(weight: float):
    """A slerp generation fitted on 150 of 200 items: (method, parent model, new model, images)."""
    parent_method = create_method("l2", {})
    method = create_method("slerp", {"pairs": 150, "weight": weight})
    images = torch.randn(200, 12, generator=torch.Generator().manual_seed(0))
    data = [(images[i], i % 4, i) for i in range(200)]
    parent = freeze(vector_model(parent_method, 12, 6, 4, seed=1))
    new = freeze(vector_model(method, 12, 8, 4, seed=2))
    method.on_train_end(TrainContext(new_model=new, old_model=parent, train_data=data, num_classes=4))
    return method, parent, new, images


def test_slerp_method_fits_procrustes_and_interpolates_with_the_parents_query():
    method, parent, new, images = _fitted(0.3)
    assert not method.trains_encoder and method.space.value == "cosine"
    backward = new.adapters[BACKWARD_ADAPTER]
    assert isinstance(backward, QueryInterpolation) and backward.weight == 0.3
    chosen = torch.randperm(200, generator=torch.Generator().manual_seed(0))[:150].sort().values
    with torch.no_grad():
        x = new(images[chosen]).embedding.double().numpy()
        y = parent(images[chosen]).embedding.double().numpy()
        queries_new, queries_old = new(images[:30]).embedding, parent(images[:30]).embedding
        got = backward(queries_new, queries_old).double().numpy()
    # Procrustes on the unit-normalised pairs, by numpy's SVD: R = s U Vᵀ for Yᵀ X = U Σ Vᵀ
    x_unit, y_unit = x / np.linalg.norm(x, axis=1, keepdims=True), y / np.linalg.norm(y, axis=1, keepdims=True)
    u, singular, vt = np.linalg.svd(y_unit.T @ x_unit, full_matrices=False)
    rotation = singular.sum() / np.sum(x_unit ** 2) * (u @ vt)
    np.testing.assert_allclose(backward.align.map.linear.weight.detach().double().numpy(), rotation, atol=1e-5)
    qn, qo = queries_new.double().numpy(), queries_old.double().numpy()
    aligned = (qn / np.linalg.norm(qn, axis=1, keepdims=True)) @ rotation.T
    np.testing.assert_allclose(got, numpy_slerp(aligned, qo, 0.3), atol=1e-5)
    # the spec (weight included) rebuilds the same adapter from the state dict
    rebuilt = build_adapter(adapter_spec(backward))
    rebuilt.load_state_dict(backward.state_dict())
    assert adapter_spec(rebuilt) == adapter_spec(backward) and adapter_spec(backward)["weight"] == 0.3
    torch.testing.assert_close(rebuilt(queries_new, queries_old), backward(queries_new, queries_old))


def test_slerp_refuses_a_space_off_the_sphere():
    with pytest.raises(ValueError, match="must be cosine"):
        create_method("slerp", {"space": "lorentz"})
    method = create_method("slerp", {"pairs": 10})
    parent = freeze(vector_model(create_method("hbct", {"clip": 1.0}), 12, 6, 4, seed=1))
    new = freeze(vector_model(method, 12, 8, 4, seed=2))
    data = [(torch.zeros(12), 0, i) for i in range(10)]
    with pytest.raises(ValueError, match="parent lorentz"):
        method.on_train_end(TrainContext(new_model=new, old_model=parent, train_data=data, num_classes=4))


def test_comparison_path_hands_the_parents_query_embeddings_to_slerp():
    _method, parent, new, images = _fitted(0.6)
    path = comparison_path("new", "old", {"old": parent, "new": new}, {"new": "old", "old": None})
    assert path.kind == "adapter" and path.query_generations == ("old",) and path.hops == ("old",)
    with torch.no_grad():
        queries, old_queries, gallery = new(images[:20]).embedding, parent(images[:20]).embedding, parent(images).embedding
    aligned_queries, aligned_gallery = path.align(queries, gallery, {"old": old_queries})
    assert torch.equal(aligned_gallery, gallery)  # the gallery stays in the old space, untouched
    rotation = new.adapters[BACKWARD_ADAPTER].align.map.linear.weight.detach().double().numpy()
    qn = queries.double().numpy()
    expected = numpy_slerp((qn / np.linalg.norm(qn, axis=1, keepdims=True)) @ rotation.T, old_queries.double().numpy(), 0.6)
    np.testing.assert_allclose(aligned_queries.double().numpy(), expected, atol=1e-5)
    torch.testing.assert_close(path.map_queries(queries, 6, {"old": old_queries}), aligned_queries)
    with pytest.raises(MissingQueryEmbeddings, match="generation 'old''s embeddings of the same queries: none were given"):
        path.map_queries(queries, 6)
    with pytest.raises(MissingQueryEmbeddings, match="5 values per query; generation 'old' embeds 6"):
        path.map_queries(queries, 6, {"old": old_queries[:, :5]})
    with pytest.raises(MissingQueryEmbeddings, match="one row per query"):
        path.align(queries, gallery, {"old": old_queries[:3]})


def test_a_plain_adapter_path_needs_no_other_queries():
    chart_map = ChartMap(AffineAdapter(3, 3, bias=False), "cosine", 1.0, "cosine", 1.0)
    assert not getattr(chart_map, "needs_target_queries", False)


def test_the_cross_test_scores_slerp_queries_made_from_the_parents_embeddings_of_the_same_items():
    """``compare_generations`` (the compatibility matrices the gate reads): the new row's old-gallery
    cell ranks the parent's gallery with slerp queries built from the parent's own embeddings of the
    query items, recomputed here by numpy."""
    from orchestrator.evaluation.generations import SplitEmbeddings, compare_generations
    from orchestrator.metrics import retrieval_metrics

    _method, parent, new, images = _fitted(0.4)
    labels, ids = torch.arange(200) % 4, torch.arange(200)
    with torch.no_grad():
        embedded = {"old": SplitEmbeddings(parent(images).embedding, labels, ids),
                    "new": SplitEmbeddings(new(images).embedding, labels, ids)}
    report = compare_generations({"old": parent, "new": new}, embedded, {"new": "old", "old": None})
    rotation = new.adapters[BACKWARD_ADAPTER].align.map.linear.weight.detach().double().numpy()
    qn = embedded["new"].embedding.double().numpy()
    moved = numpy_slerp((qn / np.linalg.norm(qn, axis=1, keepdims=True)) @ rotation.T,
                        embedded["old"].embedding.double().numpy(), 0.4)
    expected = retrieval_metrics(torch.from_numpy(moved), embedded["old"].embedding.double(), labels, labels, "cosine",
                                 query_ids=ids, gallery_ids=ids)
    assert report.value("new", "old", "map") == pytest.approx(expected.mean_ap, abs=1e-6)
    assert report.value("new", "old", "cmc@1") == pytest.approx(expected.cmc[1], abs=1e-6)
    assert report.notes[("new", "old")] == ("queries mapped by the backward adapter, interpolated with old's "
                                            "embeddings of them (slerp)")
