"""d-Simplex(-HOC): fixed head, class assignment, stationary CE and the HOC term (stationary_dsimplex.md §4, §5, §12)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from orchestrator.geometry.spaces import Space
from orchestrator.methods.dsimplex import DSimplex, prototype_targets
from orchestrator.methods.hoc import hoc_infonce
from orchestrator.methods.registry import method_class
from orchestrator.models.outputs import ModelOutput


def _output(z: torch.Tensor, head: torch.nn.Module) -> ModelOutput:
    return ModelOutput(features=z, embedding=z, logits=head(z))


def _simplex_rows(k: int) -> torch.Tensor:
    """Independent float64 d-Simplex (§4.1 reference code): unit rows, (K, K-1)."""
    n = k - 1
    t = torch.zeros(k, n, dtype=torch.float64)
    t[:-1] = torch.eye(n, dtype=torch.float64)
    t[-1] += (1.0 - math.sqrt(k)) / n
    t -= t.mean(dim=0, keepdim=True)
    return t / t.norm(dim=1, keepdim=True)


def test_registered_with_cosine_retrieval_and_identity_lift():
    method = method_class("dsimplex")()
    assert isinstance(method, DSimplex) and method.requires_parent is False
    assert method.space is Space.COSINE
    lift = method.build_lift()
    z = torch.randn(4, 9)
    features, embedding = lift(z)
    assert lift.space is Space.COSINE
    assert torch.equal(features, z) and torch.equal(embedding, z)  # raw z reaches the head (§4.2)


def test_head_is_fixed_and_matches_the_simplex():
    method = DSimplex()
    head = method.build_head(embed_dim=9, num_classes=4)  # K defaults to embed_dim + 1 = 10
    assert head.num_classes == 10
    assert sum(p.numel() for p in head.parameters() if p.requires_grad) == 0
    z = torch.randn(5, 9, dtype=torch.float64)
    expected = z @ _simplex_rows(10).T
    torch.testing.assert_close(head(z.float()).double(), expected, atol=1e-5, rtol=1e-5)
    # every generation builds bit-identical prototypes (stationarity, Theorem 1)
    assert torch.equal(head.weight, DSimplex().build_head(embed_dim=9, num_classes=7).weight)


def test_frobenius_normalization_gives_rows_of_norm_one_over_sqrt_k():
    head = DSimplex({"normalization": "frobenius", "num_prototypes": 16}).build_head(embed_dim=15, num_classes=3)
    torch.testing.assert_close(head.weight.norm(dim=1), torch.full((16,), 0.25), atol=1e-6, rtol=0)


def test_dimension_and_capacity_are_validated():
    with pytest.raises(ValueError, match=r"num_prototypes - 1 = 15 \(num_prototypes 16\), got embed_dim=8"):
        DSimplex({"num_prototypes": 16}).build_head(embed_dim=8, num_classes=3)
    with pytest.raises(ValueError, match=r"num_classes=11.*num_prototypes=10"):
        DSimplex().build_head(embed_dim=9, num_classes=11)


def test_class_assignment():
    labels = torch.tensor([0, 1, 2, 99])
    assert prototype_targets(labels, 1024).tolist() == [1023, 1022, 1021, 924]  # §4.3: y -> K-1-y
    assert prototype_targets(labels, 1024, "left_to_right").tolist() == [0, 1, 2, 99]
    with pytest.raises(ValueError, match="labels"):
        prototype_targets(torch.tensor([10]), 10)
    with pytest.raises(ValueError, match="labels"):
        prototype_targets(torch.tensor([10]), 10, "left_to_right")


@pytest.mark.parametrize("assignment", ["right_to_left", "left_to_right"])
def test_first_generation_loss_is_ce_over_all_k_logits(assignment):
    torch.manual_seed(0)
    k = 12
    method = DSimplex({"class_assignment": assignment})
    head = method.build_head(embed_dim=k - 1, num_classes=5)
    z = 3.0 * torch.randn(8, k - 1)
    labels = torch.randint(0, 5, (8,))
    terms = method.loss(_output(z, head), None, labels, ctx=None)
    assert set(terms) == {"base"}

    logits = z.double() @ _simplex_rows(k).T
    targets = (k - 1 - labels) if assignment == "right_to_left" else labels
    expected = torch.stack([torch.logsumexp(logits[i], 0) - logits[i, targets[i]] for i in range(8)]).mean()
    torch.testing.assert_close(terms["base"].double(), expected, atol=1e-5, rtol=1e-5)
    # the 7 prototypes no class uses stay in the denominator (eq. 2): dropping them changes the loss
    used = torch.unique(targets)
    restricted = F.cross_entropy(logits[:, used], torch.searchsorted(used, targets))
    assert (terms["base"].double() - restricted).abs() > 1e-3


def test_with_parent_loss_is_lambda_ce_plus_hoc():
    torch.manual_seed(1)
    k, batch, tau, lam = 8, 6, 10.0, 0.1
    method = DSimplex()
    head = method.build_head(embed_dim=k - 1, num_classes=3)
    new_z, old_z = torch.randn(batch, k - 1), torch.randn(batch, k - 1)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    terms = method.loss(_output(new_z, head), _output(old_z, head), labels, ctx=None)
    assert set(terms) == {"base", "infonce"}

    logits = new_z.double() @ _simplex_rows(k).T
    ce = torch.stack([torch.logsumexp(logits[i], 0) - logits[i, k - 1 - labels[i]] for i in range(batch)]).mean()
    cos = F.normalize(old_z.double(), dim=1) @ F.normalize(new_z.double(), dim=1).T
    nce = []
    for i in range(batch):  # code version (§5.4): same-class logits are 0, not removed
        row = [tau * cos[i, j] if labels[j] != labels[i] else torch.zeros((), dtype=torch.float64) for j in range(batch)]
        nce.append(-tau * cos[i, i] + torch.logsumexp(torch.stack(row), 0))
    torch.testing.assert_close(terms["base"].double(), lam * ce, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(terms["infonce"].double(), (1 - lam) * torch.stack(nce).mean(), atol=1e-5, rtol=1e-5)


def test_hoc_term_with_identical_features_and_distinct_labels():
    """stationary_dsimplex.md §12: reduces to −τ + logsumexp([0 (self), τ·cos(x_i, x_j) for j ≠ i])."""
    torch.manual_seed(2)
    tau, batch = 10.0, 7
    x = torch.randn(batch, 5, dtype=torch.float64)
    cos = F.normalize(x, dim=1) @ F.normalize(x, dim=1).T
    expected = []
    for i in range(batch):
        row = [torch.zeros((), dtype=torch.float64)] + [tau * cos[i, j] for j in range(batch) if j != i]
        expected.append(-tau + torch.logsumexp(torch.stack(row), 0))
    got = hoc_infonce(x, x, torch.arange(batch), tau)
    torch.testing.assert_close(got, torch.stack(expected).mean(), atol=1e-10, rtol=1e-10)


def test_parent_of_another_dimension_is_rejected():
    method = DSimplex()
    head = method.build_head(embed_dim=7, num_classes=3)
    new = _output(torch.randn(2, 7), head)
    old = ModelOutput(torch.randn(2, 5), torch.randn(2, 5))
    with pytest.raises(ValueError, match="old 5 and new 7"):
        method.loss(new, old, torch.tensor([0, 1]), ctx=None)


def test_stationary_ce_trains_features_towards_the_mapped_prototypes():
    """A few steps of eq. 2 on free features move class y to prototype K-1-y (right to left)."""
    torch.manual_seed(3)
    k = 6
    method = DSimplex()
    head = method.build_head(embed_dim=k - 1, num_classes=3)
    labels = torch.tensor([0, 1, 2])
    z = torch.zeros(3, k - 1, requires_grad=True)
    optimizer = torch.optim.SGD([z], lr=1.0)
    for _ in range(50):
        loss = sum(method.loss(_output(z, head), None, labels, ctx=None).values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert head(z.detach()).argmax(dim=1).tolist() == [5, 4, 3]
