"""UniBCT (methods/unibct.py): the structural prototype refinement against a brute-force numpy
propagation, its robustness to an outlier, and the ArcFace term through the refined prototypes."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from image_data import LabelShiftedImages
from orchestrator.methods.base import TrainContext, embed_dataset
from orchestrator.methods.common import normalized_class_means
from orchestrator.methods.independent import Independent
from orchestrator.methods.unibct import UniBCT, intra_class_graph, structural_prototypes
from orchestrator.models.encoder import EncoderConfig


def _refined_reference(embeddings: np.ndarray, labels: np.ndarray, num_classes: int, k: int, tau: float, steps: int):
    """Per class, member by member: weights over the k most cosine-similar OTHER members,
    w_ij ∝ exp(cos_ij / τ); T times f_i ← Σ_j w_ij f_j; prototype = normalised mean."""
    prototypes = np.zeros((num_classes, embeddings.shape[1]))
    for c in range(num_classes):
        members = [e / np.linalg.norm(e) for e, y in zip(embeddings, labels) if y == c]
        if not members:
            continue
        n = len(members)
        kk = min(k, n - 1)
        graph = []
        for i in range(n):
            sims = sorted(((float(members[i] @ members[j]), j) for j in range(n) if j != i), reverse=True)[:kk]
            exps = [math.exp(s / tau) for s, _ in sims]
            graph.append([(j, x / sum(exps)) for (_, j), x in zip(sims, exps)])
        features = [m.copy() for m in members]
        if n >= 2:
            for _ in range(steps):
                features = [sum(w * features[j] for j, w in graph[i]) for i in range(n)]
        mean = sum(features) / n
        prototypes[c] = mean / np.linalg.norm(mean)
    return prototypes


@pytest.mark.parametrize("k, tau, steps", [(2, 0.1, 1), (3, 0.5, 2), (10, 0.2, 1), (1, 1.0, 3)])
def test_structural_prototypes_equal_a_brute_force_propagation(k, tau, steps):
    generator = torch.Generator().manual_seed(k + steps)
    embeddings = torch.randn(17, 5, generator=generator, dtype=torch.float64)
    labels = torch.tensor([0] * 6 + [1] * 5 + [2] * 1 + [3] * 5)  # class 2: one member; class 4: none
    prototypes, present = structural_prototypes(embeddings, labels, 5, neighbours=k, temperature=tau, steps=steps,
                                                chunk_size=4)  # several row blocks
    expected = _refined_reference(embeddings.numpy(), labels.numpy(), 5, k, tau, steps)
    np.testing.assert_allclose(prototypes.numpy(), expected, rtol=1e-10, atol=1e-12)
    assert present.tolist() == [True, True, True, True, False]
    # one member: its own direction; no member: a zero row
    np.testing.assert_allclose(prototypes[2].numpy(), F.normalize(embeddings[11], dim=0).numpy())
    assert torch.count_nonzero(prototypes[4]) == 0


def test_zero_steps_are_the_normalised_class_means():
    generator = torch.Generator().manual_seed(5)
    embeddings = torch.randn(20, 4, generator=generator)
    labels = torch.arange(20) % 3
    refined, _ = structural_prototypes(embeddings, labels, 3, steps=0)
    plain, _ = normalized_class_means(embeddings, labels, 3)
    torch.testing.assert_close(refined, plain)


def test_the_graph_is_row_stochastic_without_self_loops():
    generator = torch.Generator().manual_seed(6)
    members = F.normalize(torch.randn(7, 3, generator=generator), dim=1)
    index, weight = intra_class_graph(members, neighbours=4, temperature=0.2, chunk_size=3)
    assert index.shape == weight.shape == (7, 4)
    torch.testing.assert_close(weight.sum(dim=1), torch.ones(7))
    assert not (index == torch.arange(7).unsqueeze(1)).any()
    # neighbours are the most similar others, in decreasing similarity
    similarity = members @ members.T
    for i in range(7):
        others = [j for j in torch.argsort(similarity[i], descending=True).tolist() if j != i][:4]
        assert index[i].tolist() == others
    with pytest.raises(ValueError, match="at least 2 members"):
        intra_class_graph(members[:1], 3, 0.1)


def test_an_outlier_moves_the_refined_prototype_less_than_the_plain_mean():
    generator = torch.Generator().manual_seed(7)
    direction = torch.tensor([1.0, 0.0, 0.0, 0.0])
    inliers = direction + 0.15 * torch.randn(9, 4, generator=generator)
    outlier = torch.tensor([[0.0, 1.0, 0.0, 0.0]])  # 90° away from the class
    labels = torch.zeros(10, dtype=torch.long)
    clean_plain, _ = normalized_class_means(inliers, labels[:9], 1)
    clean_refined, _ = structural_prototypes(inliers, labels[:9], 1)
    plain, _ = normalized_class_means(torch.cat([inliers, outlier]), labels, 1)
    refined, _ = structural_prototypes(torch.cat([inliers, outlier]), labels, 1)

    def shift(a, b):
        return math.degrees(math.acos(min(1.0, float(a[0] @ b[0]))))

    plain_shift, refined_shift = shift(plain, clean_plain), shift(refined, clean_refined)
    assert plain_shift > 4.0  # the outlier drags the plain mean by several degrees
    assert refined_shift < 0.25 * plain_shift


# --- the method -------------------------------------------------------------------------------
NUM_CLASSES = 5


def _encoder() -> EncoderConfig:
    return EncoderConfig(arch="test_resnet", embed_dim=6, small_input=False)


def _setup(params=None):
    data = LabelShiftedImages(n=40, num_classes=4, seed=3)
    torch.manual_seed(1)
    parent = Independent().build_model(_encoder(), NUM_CLASSES, seen_classes=[0, 1]).eval()
    method = UniBCT(params)
    torch.manual_seed(2)
    model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
    ctx = TrainContext(new_model=model, old_model=parent, train_data=data, num_classes=NUM_CLASSES, batch_size=16)
    method.on_train_start(ctx)
    return data, parent, model, method, ctx


def test_unibct_prototypes_cover_every_class_with_images_unseen_ones_included():
    params = {"neighbours": 3, "temperature": 0.3, "steps": 2}
    data, parent, _model, _method, ctx = _setup(params)
    out, labels = embed_dataset(parent, data, batch_size=7)
    expected = _refined_reference(out.embedding.double().numpy(), labels.numpy(), NUM_CLASSES, 3, 0.3, 2)
    np.testing.assert_allclose(ctx.state["unibct/prototypes"].double().numpy(), expected, atol=1e-5)
    assert ctx.state["unibct/present"].tolist() == [True, True, True, True, False]


def test_unibct_term_is_arcface_through_the_refined_prototypes():
    params = {"lam": 0.4, "scale": 12.0, "margin": 0.2}
    data, parent, model, method, ctx = _setup(params)
    images = torch.stack([data[i][0] for i in range(12)])
    labels = torch.stack([data[i][1] for i in range(12)])
    new = model(images)
    with torch.no_grad():
        old = parent(images)
    terms = method.loss(new, old, labels, ctx)
    assert set(terms) == {"base", "arcface"}
    prototypes = ctx.state["unibct/prototypes"].double().numpy()
    emb = new.embedding.detach().double().numpy()
    total = 0.0
    for e, y in zip(emb, labels.tolist()):
        cos = [float(e @ p) / np.linalg.norm(e) for p in prototypes[:4]]  # unit prototypes; class 4 absent
        row = [12.0 * (math.cos(math.acos(c) + 0.2) if j == y else c) for j, c in enumerate(cos)]
        top = max(row)
        total += top + math.log(sum(math.exp(v - top) for v in row)) - row[y]
    assert terms["arcface"].item() == pytest.approx(0.4 * total / len(emb), rel=1e-4)
    terms["arcface"].backward()
    assert model.encoder.projection.weight.grad.abs().sum() > 0
    assert model.head.weight.grad is None


def test_unibct_needs_a_parent():
    method = UniBCT()
    model = method.build_model(_encoder(), NUM_CLASSES, seen_classes=range(4))
    ctx = TrainContext(new_model=model, old_model=None, train_data=LabelShiftedImages(n=8), num_classes=NUM_CLASSES)
    with pytest.raises(ValueError, match="unibct needs a parent"):
        method.on_train_start(ctx)
