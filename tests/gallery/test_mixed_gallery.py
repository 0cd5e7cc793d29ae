"""Mixed-generation galleries ranked as one: checked against retrieval_metrics on the same items
put into one space by hand."""
import numpy as np
import pytest
import torch
from torch import nn

from orchestrator.comparison import IncomparableGenerations
from orchestrator.gallery import ShardEmbeddings, evaluate_mixed_gallery
from orchestrator.geometry import Geometry
from orchestrator.methods import create_method
from orchestrator.metrics import retrieval_metrics
from vector_models import vector_model


def model(method="independent", seed=0):
    return vector_model(create_method(method), in_dim=6, embed_dim=8, num_classes=3, seed=seed)


def split(ids, labels, embeddings, generation, space="cosine", parts=2):
    return [ShardEmbeddings(ids[p], labels[p], embeddings[p], np.full(len(p), np.nan, np.float32), generation, space, 1.0)
            for p in np.array_split(np.arange(len(ids)), parts)]


def test_a_two_generation_gallery_equals_one_ranking_over_the_mixed_embeddings():
    rng = np.random.default_rng(0)
    n = 40
    ids, labels = np.arange(n) + 1000, rng.integers(0, 4, n)
    old = rng.normal(size=(n, 8)).astype(np.float32)
    new = (old + 0.3 * rng.normal(size=(n, 8))).astype(np.float32)
    queries = torch.from_numpy(new)
    first, second = np.arange(0, 25), np.arange(25, n)  # the first 25 items still hold g0
    shards = split(ids[first], labels[first], old[first], "g0") + split(ids[second], labels[second], new[second], "g1")
    models, parents = {"g0": model(seed=1), "g1": model(seed=2)}, {"g1": "g0"}
    result = evaluate_mixed_gallery("g1", queries, labels, ids, shards, models, parents, ks=(1, 3))
    mixed = np.concatenate([old[first], new[second]])
    expected = retrieval_metrics(queries, mixed, labels, labels, "cosine", ks=(1, 3), query_ids=ids, gallery_ids=ids)
    assert result.cmc == pytest.approx(expected.cmc) and result.mean_ap == pytest.approx(expected.mean_ap)
    assert result.items_by_generation == {"g0": 25, "g1": 15}
    assert result.fraction_by_generation["g1"] == pytest.approx(15 / 40)


def test_an_adapter_generation_maps_queries_only_for_the_old_shards():
    rng = np.random.default_rng(1)
    n = 30
    ids, labels = np.arange(n), rng.integers(0, 3, n)
    old = rng.normal(size=(n, 8)).astype(np.float32)
    new = rng.normal(size=(n, 8)).astype(np.float32)
    g0, g1 = model(seed=1), model(seed=2)
    mapping = nn.Linear(8, 8, bias=False)
    g1.adapters["backward"] = mapping
    shards = split(ids[:10], labels[:10], old[:10], "g0", parts=1) + split(ids[10:], labels[10:], new[10:], "g1")
    queries = torch.from_numpy(new)
    result = evaluate_mixed_gallery("g1", queries, labels, ids, shards, {"g0": g0, "g1": g1}, {"g1": "g0"}, ks=(1,))
    with torch.no_grad():
        mapped = mapping(queries)
    distances = torch.cat([Geometry("cosine").pairwise_distance(mapped.double(), torch.from_numpy(old[:10]).double()),
                           Geometry("cosine").pairwise_distance(queries.double(), torch.from_numpy(new[10:]).double())], dim=1)
    distances[torch.arange(n), torch.arange(n)] = float("inf")  # leave-one-out
    top1 = distances.argmin(dim=1).numpy()
    assert result.cmc[1] == pytest.approx(np.mean(labels[top1] == labels))


def test_a_shard_of_an_incomparable_generation_is_refused():
    rng = np.random.default_rng(2)
    ids, labels = np.arange(10), rng.integers(0, 2, 10)
    shards = split(ids, labels, rng.normal(size=(10, 8)).astype(np.float32), "cos", parts=1)
    models = {"cos": model(seed=1), "hyp": model("hbct", seed=2)}
    with pytest.raises(IncomparableGenerations, match="'hyp' cannot search generation 'cos'"):
        evaluate_mixed_gallery("hyp", torch.randn(10, 9), labels, ids, shards, models, {})


def test_an_fct_generation_maps_the_old_shards_by_f_into_its_space():
    from orchestrator.methods.fct import build_forward_map

    rng = np.random.default_rng(3)
    n = 30
    ids, labels = np.arange(n), rng.integers(0, 3, n)
    old = rng.normal(size=(n, 6)).astype(np.float32)
    new = rng.normal(size=(n, 8)).astype(np.float32)
    g0 = vector_model(create_method("independent"), in_dim=6, embed_dim=6, num_classes=3, seed=1)
    g1 = model("fct", seed=2)
    torch.manual_seed(4)
    g1.adapters["forward_map"] = forward = build_forward_map(6, 8, "affine", 1, False)
    with torch.no_grad():
        forward.map.linear.weight.normal_()
        forward.map.linear.bias.normal_()
    shards = split(ids[:12], labels[:12], old[:12], "g0") + split(ids[12:], labels[12:], new[12:], "g1", parts=1)
    queries = torch.from_numpy(new)
    result = evaluate_mixed_gallery("g1", queries, labels, ids, shards, {"g0": g0, "g1": g1}, {"g1": "g0"}, ks=(1,))
    mapped = torch.from_numpy(old[:12]) @ forward.map.weight.detach().T + forward.map.bias.detach()
    expected = retrieval_metrics(queries, torch.cat([mapped, queries[12:]]), labels, labels, "cosine", ks=(1,),
                                 query_ids=ids, gallery_ids=ids)
    assert result.cmc == pytest.approx(expected.cmc) and result.mean_ap == pytest.approx(expected.mean_ap)
    assert result.items_by_generation == {"g0": 12, "g1": 18}
