"""Comparison paths between generations: same, direct (shared space), chained backward adapters,
and a refusal naming both generations when no distance exists."""
import pytest
import torch
from torch import nn

from orchestrator.comparison import IncomparableGenerations, comparison_path
from orchestrator.methods import create_method
from vector_models import vector_model


def model(method="independent", seed=0, **params):
    return vector_model(create_method(method, params), in_dim=6, embed_dim=8, num_classes=3, seed=seed)


def linear(seed: int, width: int = 8) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(8, width, bias=False)


def test_same_and_direct_paths_keep_the_embeddings():
    models = {"a": model(seed=1), "b": model(seed=2)}
    same = comparison_path("a", "a", models, {})
    direct = comparison_path("b", "a", models, {"b": "a"})
    assert (same.kind, direct.kind) == ("same", "direct")
    q, g = torch.randn(4, 8), torch.randn(5, 8)
    aligned_q, aligned_g = direct.align(q, g)
    assert torch.equal(aligned_q, q) and torch.equal(aligned_g, g)
    with pytest.raises(IncomparableGenerations, match="dimensions 8 vs 7"):
        direct.align(q, torch.randn(5, 7))


def test_backward_adapters_are_chained_down_to_the_ancestor_and_truncated():
    g0, g1, g2 = model(seed=1), model(seed=2), model(seed=3)
    b1, b2 = linear(11), linear(12, width=6)  # B2 maps g2 into a 6-wide prefix of g1's space
    g1.adapters["backward"], g2.adapters["backward"] = b1, b2
    models, parents = {"g0": g0, "g1": g1, "g2": g2}, {"g1": "g0", "g2": "g1"}
    path = comparison_path("g2", "g0", models, parents)
    assert path.kind == "adapter" and path.note == "queries mapped by the backward chain of 2 adapters"
    q, g = torch.randn(4, 8), torch.randn(5, 8)
    # B2 gives 6 coordinates; B1 expects 8, so the chain must fail loudly rather than pad silently
    with pytest.raises(RuntimeError):
        path.align(q, g)
    g2.adapters["backward"] = b2 = linear(12)
    path = comparison_path("g2", "g0", models, parents)
    aligned_q, aligned_g = path.align(q, g)
    with torch.no_grad():
        expected = q @ b2.weight.T @ b1.weight.T
    torch.testing.assert_close(aligned_q, expected)
    assert torch.equal(aligned_g, g)
    one_hop = comparison_path("g1", "g0", models, parents)
    assert one_hop.note == "queries mapped by the backward adapter"
    g1.adapters["backward"] = b1_narrow = linear(13, width=5)
    q1, g1_emb = comparison_path("g1", "g0", models, parents).align(q, g)
    assert q1.shape == (4, 5) and torch.equal(g1_emb, g[:, :5])
    torch.testing.assert_close(q1, q @ b1_narrow.weight.detach().T)


def test_different_spaces_without_adapters_are_refused_with_both_names():
    models = {"cos": model("independent"), "hyp": model("hbct")}
    with pytest.raises(IncomparableGenerations) as info:
        comparison_path("hyp", "cos", models, {"hyp": "cos"})
    assert "'hyp'" in str(info.value) and "'cos'" in str(info.value)
    assert info.value.reason.startswith("no common distance: lorentz")
    hyp_other_curvature = model("hbct", curv=2.0)
    with pytest.raises(IncomparableGenerations, match="K=2"):
        comparison_path("h2", "hyp", {"hyp": models["hyp"], "h2": hyp_other_curvature}, {})
    assert comparison_path("h2", "hyp", {"hyp": models["hyp"], "h2": model("hbct", seed=4)}, {}).kind == "direct"
