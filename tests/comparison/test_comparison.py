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


# --- forward maps (FCT) ---------------------------------------------------------------------------
def fct_lineage():
    """g0 ← g1 ← g2, g1 and g2 FCT generations (a lone forward map each), plus g3, a BCT-like child of
    g2 (no adapter), and s1, an FCT sibling of g1."""
    models = {name: model(seed=seed) for seed, name in enumerate(("g0", "g1", "g2", "g3", "s1"))}
    for seed, name in ((21, "g1"), (22, "g2"), (23, "s1")):
        models[name].adapters["forward_map"] = linear(seed)
    return models, {"g0": None, "g1": "g0", "g2": "g1", "g3": "g2", "s1": "g0"}


def test_forward_maps_are_chained_over_the_gallery_into_the_query_space():
    models, parents = fct_lineage()
    f1, f2 = models["g1"].adapters["forward_map"], models["g2"].adapters["forward_map"]
    q, g = torch.randn(4, 8), torch.randn(5, 8)
    one_hop = comparison_path("g1", "g0", models, parents)
    assert one_hop.kind == "forward" and one_hop.maps_gallery and one_hop.note == "gallery mapped by the forward map F"
    aligned_q, aligned_g = one_hop.align(q, g)
    assert torch.equal(aligned_q, q)
    torch.testing.assert_close(aligned_g, g @ f1.weight.detach().T)
    two_hops = comparison_path("g2", "g0", models, parents)
    assert two_hops.kind == "forward" and two_hops.note == "gallery mapped by the forward chain of 2 maps F"
    torch.testing.assert_close(two_hops.align(q, g)[1], g @ f1.weight.detach().T @ f2.weight.detach().T)
    torch.testing.assert_close(two_hops.map_gallery(g), g @ f1.weight.detach().T @ f2.weight.detach().T)
    assert torch.equal(two_hops.map_queries(q, 8), q)  # an index over the mapped gallery is in the query space
    # the distance is measured in the query generation's space
    assert (two_hops.space, two_hops.curv) == (models["g2"].space, models["g2"].curv)
    # F's output width must be the query's: a mismatch is refused, not truncated
    models["g1"].adapters["forward_map"] = linear(24, width=6)
    with pytest.raises(IncomparableGenerations, match="dimensions 8 vs 6"):
        comparison_path("g1", "g0", models, parents).align(q, g)


def test_raw_embeddings_across_an_fct_generation_are_refused():
    models, parents = fct_lineage()
    for query, gallery, independent in [("g0", "g1", "g1"), ("g1", "s1", "g1"), ("g3", "g0", "g2"),
                                        ("g3", "g1", "g2"), ("g0", "g3", "g2")]:
        with pytest.raises(IncomparableGenerations, match=f"generation '{independent}' was trained independently"):
            comparison_path(query, gallery, models, parents)
    # a child compatible by training with the FCT generation compares with it directly
    assert comparison_path("g3", "g2", models, parents).kind == "direct"
    # without the lineage an FCT generation is not assumed to share anyone's space
    with pytest.raises(IncomparableGenerations, match="'g1' was trained independently"):
        comparison_path("g1", "g0", models, {})


def test_a_backward_adapter_takes_precedence_and_a_lone_forward_map_is_never_a_backward_one():
    models, parents = fct_lineage()
    models["g1"].adapters["backward"] = b1 = linear(31)  # g1 is now a λ-orth generation (B and F)
    path = comparison_path("g1", "g0", models, parents)
    assert path.kind == "adapter" and path.gallery_maps == ()
    q, g = torch.randn(4, 8), torch.randn(5, 8)
    aligned_q, aligned_g = path.align(q, g)
    torch.testing.assert_close(aligned_q, q @ b1.weight.detach().T)
    assert torch.equal(aligned_g, g)
    # g2 (lone F) over g1 (B and F): forward one hop; g2 → g0 has no chain of lone forward maps
    assert comparison_path("g2", "g1", models, parents).kind == "forward"
    with pytest.raises(IncomparableGenerations, match="'g2' was trained independently"):
        comparison_path("g2", "g0", models, parents)


def test_a_float64_forward_map_takes_a_float32_gallery_and_returns_the_queries_dtype():
    models, parents = fct_lineage()
    f1 = models["g1"].adapters["forward_map"].double()
    q, g = torch.randn(4, 8), torch.randn(5, 8)
    aligned_q, aligned_g = comparison_path("g1", "g0", models, parents).align(q, g)
    assert aligned_q.dtype == aligned_g.dtype == torch.float32
    torch.testing.assert_close(aligned_g, (g.double() @ f1.weight.detach().T).float())
