"""The search router: per-shard FAISS search along each generation's comparison path, merged into
one top-k; checked against brute-force rankings computed here with the spaces' distances."""
from datetime import datetime, timezone

import numpy as np
import pytest
import torch
from torch import nn

from orchestrator.gallery import ShardEmbeddings, evaluate_mixed_gallery, write_shard
from orchestrator.geometry import Geometry, lorentz
from orchestrator.index import ShardIndex, build_index, load_index
from orchestrator.lineage.records import CompatibilityRecord, ShardRecord
from orchestrator.methods import create_method
from orchestrator.methods.fct import build_forward_map
from orchestrator.search import (
    CompatibilityCriterion,
    IncompatibleShards,
    SearchRouter,
    ShardHits,
    merge_top_k,
    plan_routes,
    search_merged,
    search_shards,
)
from orchestrator.search.router import load_route
from orchestrator.search.router_evaluation import evaluate_search
from orchestrator.storage import ChecksumMismatch
from vector_models import vector_model

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def model(method="independent", seed=0, **params):
    return vector_model(create_method(method, params), in_dim=6, embed_dim=8, num_classes=3, seed=seed)


def shard_record(tmp_path, index, generation, ids, embeddings, space="cosine", curv=1.0):
    uri = str(tmp_path / f"shard-{index}.index")
    build_index(embeddings, space, "flat", ids, curv=curv).save(uri)
    return ShardRecord("gallery", index, len(ids), generation, None, uri, None, NOW)


def criterion(values, metric="map"):
    return CompatibilityCriterion.from_records(
        [CompatibilityRecord(q, g, metric, v, "test") for (q, g), v in values.items()], metric)


def brute_force_top_k(distances, ids, k):
    order = np.lexsort((ids[None, :].repeat(len(distances), 0), distances), axis=1)[:, :k]
    return np.take_along_axis(distances, order, axis=1), ids[order]


# --- merging --------------------------------------------------------------------------------------

def test_merge_top_k_equals_one_sort_of_all_candidates_and_ignores_shard_order():
    rng = np.random.default_rng(0)
    q, k = 7, 5
    parts = []
    for shard in range(4):
        ids = rng.choice(1000, size=(q, 3 + shard), replace=False) + 1000 * shard
        distances = np.sort(rng.integers(0, 6, size=ids.shape).astype(float), axis=1)  # many ties
        parts.append((distances, ids, shard))
    distances, ids, sources = merge_top_k(*zip(*[(d, i, s) for d, i, s in parts]), k=k)
    every_d = np.concatenate([p[0] for p in parts], axis=1)
    every_i = np.concatenate([p[1] for p in parts], axis=1)
    for row in range(q):
        expected = sorted(zip(every_d[row], every_i[row]))[:k]
        assert list(zip(distances[row], ids[row])) == expected
        assert all(i // 1000 == s for i, s in zip(ids[row], sources[row]))
    reversed_parts = parts[::-1]
    again = merge_top_k(*zip(*[(d, i, s) for d, i, s in reversed_parts]), k=k)
    np.testing.assert_array_equal(again[1], ids)


def test_merge_top_k_pads_missing_slots_with_minus_one_and_infinity():
    distances, ids, sources = merge_top_k([np.array([[0.5]])], [np.array([[42]])], [3], k=3)
    assert ids.tolist() == [[42, -1, -1]] and sources.tolist() == [[3, -1, -1]]
    assert distances[0, 0] == 0.5 and np.isinf(distances[0, 1:]).all()


# --- routing --------------------------------------------------------------------------------------

def test_three_generations_direct_and_adapter_paths_equal_the_brute_force_ranking(tmp_path):
    rng = np.random.default_rng(1)
    n, k = 60, 10
    ids = np.arange(n) * 3 + 7
    g0_emb, g1_emb, g2_emb = (rng.normal(size=(n, 8)).astype(np.float32) for _ in range(3))
    models = {"g0": model(seed=0), "g1": model(seed=1), "g2": model(seed=2)}
    backward = nn.Linear(8, 8, bias=False)
    models["g2"].adapters["backward"] = backward  # g2 reaches g1 through B; g2 → g0 is direct (same space)
    parents = {"g0": None, "g1": "g0", "g2": "g1"}
    parts = {"g0": np.arange(0, 20), "g1": np.arange(20, 35), "g2": np.arange(35, n)}
    shards = [shard_record(tmp_path, 0, "g0", ids[parts["g0"]][:12], g0_emb[parts["g0"]][:12]),
              shard_record(tmp_path, 1, "g0", ids[parts["g0"]][12:], g0_emb[parts["g0"]][12:]),
              shard_record(tmp_path, 2, "g1", ids[parts["g1"]], g1_emb[parts["g1"]]),
              shard_record(tmp_path, 3, "g2", ids[parts["g2"]], g2_emb[parts["g2"]])]
    router = SearchRouter("g2", models, parents, shards, None, ShardIndex.load)
    queries = torch.from_numpy(rng.normal(size=(9, 8)).astype(np.float32))
    result = router.search(queries, k)

    with torch.no_grad():
        mapped = backward(queries)
    columns = [Geometry("cosine").pairwise_distance(queries.double(), torch.from_numpy(g0_emb[parts["g0"]]).double()),
               Geometry("cosine").pairwise_distance(mapped.double(), torch.from_numpy(g1_emb[parts["g1"]]).double()),
               Geometry("cosine").pairwise_distance(queries.double(), torch.from_numpy(g2_emb[parts["g2"]]).double())]
    all_ids = np.concatenate([ids[parts[g]] for g in ("g0", "g1", "g2")])
    expected_d, expected_ids = brute_force_top_k(torch.cat(columns, dim=1).numpy(), all_ids, k)
    np.testing.assert_array_equal(result.ids, expected_ids)
    np.testing.assert_allclose(result.distances, expected_d, rtol=1e-6, atol=1e-7)
    generation_of_id = {int(i): g for g in parts for i in ids[parts[g]]}
    assert [[generation_of_id[int(i)] for i in row] for row in result.ids] == result.generations().tolist()
    assert router.paths() == {"g0": "direct", "g1": "queries mapped by the backward adapter", "g2": "same"}


def test_shards_searched_in_separate_shares_and_merged_equal_the_brute_force_ranking(tmp_path):
    """What a server with shard-search replicas does: one plan, each share of the routes loaded and
    searched on its own (``search_shards``), the lists merged by ``search_merged``."""
    rng = np.random.default_rng(4)
    ids = np.arange(40) * 5 + 1
    old, new = rng.normal(size=(40, 8)).astype(np.float32), rng.normal(size=(40, 8)).astype(np.float32)
    models, parents = {"g0": model(seed=0), "g1": model(seed=1)}, {"g0": None, "g1": "g0"}
    models["g1"].adapters["backward"] = backward = nn.Linear(8, 8, bias=False)
    generation = ["g0", "g1", "g0", "g1", "g0"]
    rows = np.array_split(np.arange(40), 5)
    shards = [shard_record(tmp_path, i, g, ids[r], (old if g == "g0" else new)[r]) for i, (g, r) in enumerate(zip(generation, rows))]
    plan = plan_routes("g1", models, parents, shards, None)
    shares = [[load_route(shard, path, ShardIndex.load) for shard, path in plan.admitted if shard.index % 2 == share]
              for share in (0, 1)]

    def search_chunk(chunk, others):
        assert others == {}  # no path here interpolates with another generation's queries
        hits = ShardHits()
        for routes in shares[::-1]:  # the shares answer in any order
            hits.extend(search_shards(routes, chunk, 6))
        return hits

    queries = torch.from_numpy(rng.normal(size=(7, 8)).astype(np.float32))
    result = plan.result(*search_merged(queries, 6, 5, search_chunk))
    with torch.no_grad():
        mapped = backward(queries).double()  # g1's queries reach g0's shards through B
    cosine = Geometry("cosine").pairwise_distance
    distances = np.concatenate([cosine(mapped if g == "g0" else queries.double(),
                                       torch.from_numpy((old if g == "g0" else new)[r]).double()).numpy()
                                for g, r in zip(generation, rows)], axis=1)
    expected_d, expected_ids = brute_force_top_k(distances, np.concatenate([ids[r] for r in rows]), 6)
    np.testing.assert_array_equal(result.ids, expected_ids)
    np.testing.assert_allclose(result.distances, expected_d, rtol=1e-6, atol=1e-7)
    assert result.paths == {"g0": "queries mapped by the backward adapter", "g1": "same"}
    whole = SearchRouter("g1", models, parents, shards, None, ShardIndex.load).search(queries, 6)
    np.testing.assert_array_equal(whole.ids, result.ids)
    np.testing.assert_array_equal(whole.shards, result.shards)


def test_lorentz_shards_of_two_generations_rank_by_geodesic_distance(tmp_path):
    draws = torch.Generator().manual_seed(2)
    curv = 0.7
    points = lorentz.expmap0(torch.cat([torch.zeros(50, 1), torch.randn(50, 5, dtype=torch.float64, generator=draws)], 1), curv)
    ids = np.arange(50) + 100
    models = {"a": model("hbct", seed=0, curv=curv), "b": model("hbct", seed=1, curv=curv)}
    shards = [shard_record(tmp_path, 0, "a", ids[:30], points[:30].numpy(), "lorentz", curv),
              shard_record(tmp_path, 1, "b", ids[30:], points[30:].numpy(), "lorentz", curv)]
    queries = lorentz.expmap0(torch.cat([torch.zeros(6, 1), torch.randn(6, 5, dtype=torch.float64, generator=draws)], 1), curv)
    router = SearchRouter("b", models, {"a": None, "b": "a"}, shards, None, ShardIndex.load)
    result = router.search(queries, 8)
    expected_d, expected_ids = brute_force_top_k(lorentz.pairwise_distance(queries, points, curv).numpy(), ids, 8)
    np.testing.assert_array_equal(result.ids, expected_ids)
    np.testing.assert_allclose(result.distances, expected_d, rtol=1e-6)  # the index stores float32


def test_search_evaluation_over_the_whole_gallery_equals_the_mixed_gallery_evaluation(tmp_path):
    rng = np.random.default_rng(3)
    n = 45
    ids, labels = np.arange(n) + 500, rng.integers(0, 4, n)
    old = rng.normal(size=(n, 8)).astype(np.float32)
    new = (old + 0.4 * rng.normal(size=(n, 8))).astype(np.float32)
    models, parents = {"g0": model(seed=1), "g1": model(seed=2)}, {"g0": None, "g1": "g0"}
    first, second = np.arange(0, 28), np.arange(28, n)
    shards = [shard_record(tmp_path, 0, "g0", ids[first], old[first]),
              shard_record(tmp_path, 1, "g1", ids[second], new[second])]
    router = SearchRouter("g1", models, parents, shards, None, ShardIndex.load)
    searched = evaluate_search(router, torch.from_numpy(new), labels, ids, labels, query_ids=ids, ks=(1, 5))
    as_files = [ShardEmbeddings(ids[p], labels[p], e[p], np.full(len(p), np.nan, np.float32), g, "cosine", 1.0)
                for p, e, g in ((first, old, "g0"), (second, new, "g1"))]
    expected = evaluate_mixed_gallery("g1", torch.from_numpy(new), labels, ids, as_files, models, parents, ks=(1, 5))
    assert searched.result.cmc == pytest.approx(expected.cmc)
    assert searched.result.mean_ap == pytest.approx(expected.mean_ap)
    assert searched.k == n and searched.searched_items == n


# --- refusal --------------------------------------------------------------------------------------

def two_generation_gallery(tmp_path):
    rng = np.random.default_rng(4)
    ids, labels = np.arange(20), np.repeat(np.arange(4), 5)
    emb = rng.normal(size=(20, 8)).astype(np.float32)
    shards = [shard_record(tmp_path, 0, "g0", ids[:12], emb[:12]), shard_record(tmp_path, 1, "g1", ids[12:], emb[12:])]
    return ids, labels, emb, shards, {"g0": model(seed=0), "g1": model(seed=1)}, {"g0": None, "g1": "g0"}


def test_a_shard_below_the_criterion_is_refused_with_both_values(tmp_path):
    _ids, _labels, _emb, shards, models, parents = two_generation_gallery(tmp_path)
    values = {("g1", "g0"): 0.61, ("g0", "g0"): 0.64, ("g1", "g1"): 0.9}
    with pytest.raises(IncompatibleShards) as raised:
        SearchRouter("g1", models, parents, shards, criterion(values), ShardIndex.load)
    message = str(raised.value)
    assert "shard 0 (12 items of g0)" in message and "below the compatibility criterion" in message
    assert "0.6100" in message and "0.6400" in message and "--skip-incompatible" in message
    assert [s.index for s in raised.value.shards] == [0]


def test_a_tie_fails_the_criterion_and_an_unrecorded_pair_is_refused(tmp_path):
    assert not criterion({("g1", "g0"): 0.5, ("g0", "g0"): 0.5}).verdict("g1", "g0").admitted
    _ids, _labels, _emb, shards, models, parents = two_generation_gallery(tmp_path)
    with pytest.raises(IncompatibleShards, match=r"no compatibility recorded \(map on 'test'\) for g1 → g0"):
        SearchRouter("g1", models, parents, shards, criterion({("g0", "g0"): 0.6}), ShardIndex.load)


def test_a_pair_without_a_common_distance_is_refused(tmp_path):
    ids, _labels, emb, shards, models, parents = two_generation_gallery(tmp_path)
    models["g0"] = model("independent", seed=0, space="euclidean")
    values = {("g1", "g0"): 0.9, ("g0", "g0"): 0.5}
    with pytest.raises(IncompatibleShards, match="no common distance: cosine"):
        SearchRouter("g1", models, parents, shards, criterion(values), ShardIndex.load)


def test_skip_serves_the_compatible_shards_and_counts_the_hidden_items_as_misses(tmp_path):
    ids, labels, emb, shards, models, parents = two_generation_gallery(tmp_path)
    values = {("g1", "g0"): 0.1, ("g0", "g0"): 0.6}
    router = SearchRouter("g1", models, parents, shards, criterion(values), ShardIndex.load, on_incompatible="skip")
    result = router.search(torch.from_numpy(emb), 20)
    assert set(result.ids[result.ids >= 0].tolist()) == set(ids[12:].tolist())
    assert [s.index for s in result.skipped] == [0] and router.searchable_items == 8
    evaluation = evaluate_search(router, torch.from_numpy(emb[12:]), labels[12:], ids, labels, query_ids=ids[12:])
    # independent: with only shard 1 searchable, each query's relevant items in shard 0 are never found
    hidden = np.array([np.sum(labels[:12] == label) for label in labels[12:]])
    total = np.array([np.sum(labels == label) - 1 for label in labels[12:]])
    assert evaluation.result.mean_ap <= float(np.mean(1 - hidden / total)) + 1e-12
    assert "shard 0 (12 items of g0)" in evaluation.as_row()["skipped"]


def test_an_adapter_narrower_than_the_gallery_index_is_refused_at_search(tmp_path):
    ids, _labels, emb, shards, models, parents = two_generation_gallery(tmp_path)
    models["g1"].adapters["backward"] = nn.Linear(8, 5, bias=False)
    router = SearchRouter("g1", models, parents, shards, None, ShardIndex.load)
    with pytest.raises(ValueError, match="adapted queries have 5 coordinates but the gallery's index holds 8"):
        router.search(torch.from_numpy(emb), 3)


# --- forward path (FCT) ---------------------------------------------------------------------------

def mlp_by_hand(forward, x):
    """F(x) of an fct EmbeddingMap computed from its weights: W2 relu(W1 x/‖x‖ + b1) + b2."""
    inner = forward.map
    x = x / x.norm(dim=1, keepdim=True)
    hidden = torch.clamp(x @ inner.hidden.weight.detach().T + inner.hidden.bias.detach(), min=0)
    return hidden @ inner.output.weight.detach().T + inner.output.bias.detach()


def parquet_shard_record(tmp_path, index, generation, ids, labels, embeddings, with_index=False):
    """A shard row whose Parquet file is written (sha256 in the row); no index file unless asked."""
    shard = ShardEmbeddings(ids, labels, embeddings, np.full(len(ids), np.nan, np.float32), generation, "cosine", 1.0)
    uri = str(tmp_path / f"shard-{index}.parquet")
    digest = write_shard(uri, shard)
    index_uri = None
    if with_index:
        index_uri = str(tmp_path / f"shard-{index}.index")
        build_index(embeddings, "cosine", "flat", ids).save(index_uri)
    return ShardRecord("gallery", index, len(ids), generation, uri, index_uri, digest, NOW)


def fct_generations():
    torch.manual_seed(5)
    models = {"g0": model(seed=0), "g1": model("fct", seed=1), "g2": model("fct", seed=2)}
    models["g1"].adapters["forward_map"] = build_forward_map(8, 8, "mlp", 16, True)
    models["g2"].adapters["forward_map"] = build_forward_map(8, 8, "mlp", 16, True)
    return models, {"g0": None, "g1": "g0", "g2": "g1"}


def test_forward_shards_are_mapped_by_f_into_an_in_memory_index_equal_to_the_brute_force_ranking(tmp_path):
    rng = np.random.default_rng(6)
    n, k = 50, 12
    ids, labels = np.arange(n) * 2 + 1, rng.integers(0, 3, n)
    emb = {g: rng.normal(size=(n, 8)).astype(np.float32) for g in ("g0", "g1", "g2")}
    parts = {"g0": np.arange(0, 20), "g1": np.arange(20, 35), "g2": np.arange(35, n)}
    models, parents = fct_generations()
    # old shards: no index file at all (the stored index, in the old space, is of no use to g2)
    shards = [parquet_shard_record(tmp_path, i, g, ids[parts[g]], labels[parts[g]], emb[g][parts[g]], with_index=(g == "g2"))
              for i, g in enumerate(("g0", "g1", "g2"))]
    router = SearchRouter("g2", models, parents, shards, None, ShardIndex.load)
    queries = torch.from_numpy(rng.normal(size=(7, 8)).astype(np.float32))
    result = router.search(queries, k)

    f1, f2 = models["g1"].adapters["forward_map"], models["g2"].adapters["forward_map"]
    gallery = {g: torch.from_numpy(emb[g][parts[g]]) for g in parts}
    in_g2_space = [mlp_by_hand(f2, mlp_by_hand(f1, gallery["g0"])), mlp_by_hand(f2, gallery["g1"]), gallery["g2"]]
    q = queries.double()
    columns = [1 - (q / q.norm(dim=1, keepdim=True)) @ (g.double() / g.double().norm(dim=1, keepdim=True)).T for g in in_g2_space]
    all_ids = np.concatenate([ids[parts[g]] for g in ("g0", "g1", "g2")])
    expected_d, expected_ids = brute_force_top_k(torch.cat(columns, dim=1).numpy(), all_ids, k)
    np.testing.assert_array_equal(result.ids, expected_ids)
    np.testing.assert_allclose(result.distances, expected_d, rtol=1e-5, atol=1e-6)
    assert router.paths() == {
        "g0": "gallery mapped by the forward chain of 2 maps F; in-memory flat index of the mapped shard embeddings",
        "g1": "gallery mapped by the forward map F; in-memory flat index of the mapped shard embeddings",
        "g2": "same"}
    assert result.paths == router.paths()

    # the search evaluation over the whole gallery equals the exact mixed-gallery evaluation
    as_files = [ShardEmbeddings(ids[parts[g]], labels[parts[g]], emb[g][parts[g]], np.full(len(parts[g]), np.nan, np.float32),
                                g, "cosine", 1.0) for g in parts]
    searched = evaluate_search(router, torch.from_numpy(emb["g2"]), labels, ids, labels, query_ids=ids, ks=(1, 5))
    expected = evaluate_mixed_gallery("g2", torch.from_numpy(emb["g2"]), labels, ids, as_files, models, parents, ks=(1, 5))
    assert searched.result.cmc == pytest.approx(expected.cmc)
    assert searched.result.mean_ap == pytest.approx(expected.mean_ap)


def test_a_forward_shard_is_read_with_its_checksum_and_an_old_serving_generation_is_refused(tmp_path):
    rng = np.random.default_rng(7)
    ids, labels = np.arange(10), rng.integers(0, 2, 10)
    models, parents = fct_generations()
    shard = parquet_shard_record(tmp_path, 0, "g0", ids, labels, rng.normal(size=(10, 8)).astype(np.float32))
    tampered = ShardRecord(shard.gallery, 0, 10, "g0", shard.embeddings_uri, None, "0" * 64, NOW)
    with pytest.raises(ChecksumMismatch):
        SearchRouter("g1", models, parents, [tampered], None, ShardIndex.load)
    no_file = ShardRecord(shard.gallery, 0, 10, "g0", None, None, None, NOW)
    with pytest.raises(ValueError, match="has no embeddings file"):
        SearchRouter("g1", models, parents, [no_file], None, ShardIndex.load)
    # the parent's raw queries against the FCT generation's raw shard: no common space
    own = parquet_shard_record(tmp_path, 1, "g1", ids, labels, rng.normal(size=(10, 8)).astype(np.float32), with_index=True)
    with pytest.raises(IncompatibleShards, match="'g1' was trained independently"):
        SearchRouter("g0", models, parents, [own], None, ShardIndex.load)


def test_shards_whose_indexes_return_different_units_are_not_merged(tmp_path):
    # gallery.index changed mid-lineage: g0's shard has an exact index, g1's a product-quantised one
    rng = np.random.default_rng(5)
    ids0, ids1 = np.arange(0, 30), np.arange(30, 60)
    emb0, emb1 = rng.normal(size=(30, 8)).astype(np.float32), rng.normal(size=(30, 8)).astype(np.float32)
    exact = shard_record(tmp_path, 0, "g0", ids0, emb0)
    pq_uri = str(tmp_path / "shard-1-pq.index")
    build_index(emb1, "cosine", "pq", ids1, pq_m=2, pq_nbits=2).save(pq_uri)
    compressed = ShardRecord("gallery", 1, len(ids1), "g1", None, pq_uri, None, NOW)
    models = {"g0": model(seed=0), "g1": model(seed=1)}
    parents = {"g0": None, "g1": "g0"}
    with pytest.raises(ValueError, match=r"different units.*shard 0 \(g0, flat\).*shard 1 \(g1, pq\).*gallery\.index"):
        SearchRouter("g1", models, parents, [exact, compressed], None, load_index)
    # exact kinds share the space's distance: a flat and an HNSW shard merge
    hnsw_uri = str(tmp_path / "shard-1-hnsw.index")
    build_index(emb1, "cosine", "hnsw", ids1).save(hnsw_uri)
    router = SearchRouter("g1", models, parents,
                          [exact, ShardRecord("gallery", 1, len(ids1), "g1", None, hnsw_uri, None, NOW)], None, load_index)
    assert router.searchable_items == 60


def numpy_slerp(a, b, t):
    """Row-wise slerp by the textbook formula (independent of the code under test)."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    theta = np.arccos(np.clip(np.sum(a * b, axis=1, keepdims=True), -1, 1))
    return (np.sin((1 - t) * theta) * a + np.sin(t * theta) * b) / np.sin(theta)


def test_a_slerp_path_searches_the_old_shards_with_the_interpolated_query_and_equals_numpy(tmp_path):
    """g1 (a given encoder, 8 wide) reaches g0's untouched gallery (5 wide) by slerp: the Procrustes
    rotation R of its query, interpolated on the sphere with g0's own embedding of the query."""
    from orchestrator.comparison import MissingQueryEmbeddings
    from orchestrator.models.adapters import AffineAdapter, ChartMap, QueryInterpolation

    rng = np.random.default_rng(7)
    ids = np.arange(30) * 2 + 3
    old = rng.normal(size=(20, 5)).astype(np.float32)
    new = rng.normal(size=(10, 8)).astype(np.float32)
    rotation = np.linalg.qr(rng.normal(size=(8, 8)))[0][:5]  # (5, 8), orthonormal rows
    align = AffineAdapter(8, 5, bias=False)
    with torch.no_grad():
        align.linear.weight.copy_(torch.from_numpy(rotation))
    models = {"g0": vector_model(create_method("l2", {}), 6, 5, 3, seed=0), "g1": model(seed=1)}
    models["g1"].adapters["backward"] = QueryInterpolation(ChartMap(align, "cosine", 1.0, "cosine", 1.0), 0.35)
    parents = {"g0": None, "g1": "g0"}
    shards = [shard_record(tmp_path, 0, "g0", ids[:12], old[:12]), shard_record(tmp_path, 1, "g0", ids[12:20], old[12:]),
              shard_record(tmp_path, 2, "g1", ids[20:], new)]
    router = SearchRouter("g1", models, parents, shards, None, ShardIndex.load)
    assert router.query_generations == ("g0",)
    queries_new = rng.normal(size=(6, 8)).astype(np.float32)
    queries_old = rng.normal(size=(6, 5)).astype(np.float32)
    result = router.search(torch.from_numpy(queries_new), 9, {"g0": torch.from_numpy(queries_old)})

    unit_new = queries_new / np.linalg.norm(queries_new, axis=1, keepdims=True)
    moved = numpy_slerp(unit_new.astype(np.float64) @ rotation.T, queries_old.astype(np.float64), 0.35)

    def cosine_distance(q, g):
        return 1 - (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (g / np.linalg.norm(g, axis=1, keepdims=True)).T

    distances = np.concatenate([cosine_distance(moved, old.astype(np.float64)),
                                cosine_distance(queries_new.astype(np.float64), new.astype(np.float64))], axis=1)
    expected_d, expected_ids = brute_force_top_k(distances, ids, 9)
    np.testing.assert_array_equal(result.ids, expected_ids)
    np.testing.assert_allclose(result.distances, expected_d, rtol=1e-5, atol=1e-6)
    with pytest.raises(MissingQueryEmbeddings, match="'g0''s embeddings of the same queries: none were given"):
        router.search(torch.from_numpy(queries_new), 9)
    # a router whose paths need no other generation's queries takes none
    assert SearchRouter("g0", models, parents, shards[:2], None, ShardIndex.load).query_generations == ()


def test_an_image_query_is_embedded_by_the_old_generation_only_for_a_slerp_path(tmp_path):
    """``SearchService.encode_for_search``: the serving generation's embeddings, and the old
    generation's of the same images only when a path interpolates with them (the router's hits then
    equal those of the two embeddings searched directly)."""
    from orchestrator.models.adapters import AffineAdapter, ChartMap, QueryInterpolation
    from orchestrator.search.service import SearchService

    def image_model(method, width, seed):
        built = vector_model(create_method(method, {}), 12, width, 3, seed=seed)  # 2×2 RGB images, flattened
        built.encoder.proj = nn.Sequential(nn.Flatten(), built.encoder.proj)
        return built

    models = {"g0": image_model("l2", 5, 0), "g1": image_model("independent", 8, 1)}
    models["g1"].adapters["backward"] = QueryInterpolation(
        ChartMap(AffineAdapter(8, 5, bias=False), "cosine", 1.0, "cosine", 1.0), 0.5)
    parents = {"g0": None, "g1": "g0"}
    rng = np.random.default_rng(3)
    shards = [shard_record(tmp_path, 0, "g0", np.arange(10), rng.normal(size=(10, 5)).astype(np.float32))]
    service = SearchService(SearchRouter("g1", models, parents, shards, None, ShardIndex.load), 2,
                            ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
    images = rng.integers(0, 256, size=(4, 2, 2, 3), dtype=np.uint8)
    queries, others = service.encode_for_search(images)
    assert queries.shape == (4, 8) and list(others) == ["g0"] and others["g0"].shape == (4, 5)
    pixels = torch.from_numpy((images / 255.0 - 0.5) / 0.25).permute(0, 3, 1, 2).float()
    with torch.no_grad():
        torch.testing.assert_close(others["g0"], models["g0"](pixels).embedding)
        torch.testing.assert_close(queries, models["g1"](pixels).embedding)
    assert service.width == 8 and service.width_of("g0") == 5
    found = service.search_images(images, 4)
    np.testing.assert_array_equal(found.ids, service.router.search(queries, 4, others).ids)
    plain = SearchService(SearchRouter("g0", models, parents, shards, None, ShardIndex.load), 2,
                          ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
    assert plain.encode_for_search(images)[1] == {}


def test_a_slerp_search_evaluation_equals_the_mixed_gallery_evaluation_with_the_old_queries(tmp_path):
    """The gallery evaluation (mixed galleries) and the router take the old generation's query
    embeddings the same way, so over the whole gallery both rank alike."""
    from orchestrator.models.adapters import AffineAdapter, ChartMap, QueryInterpolation

    rng = np.random.default_rng(5)
    n = 40
    ids, labels = np.arange(n) + 100, rng.integers(0, 4, n)
    old = rng.normal(size=(n, 5)).astype(np.float32)
    new = rng.normal(size=(n, 8)).astype(np.float32)
    align = AffineAdapter(8, 5, bias=False)
    models = {"g0": vector_model(create_method("l2", {}), 6, 5, 3, seed=0), "g1": model(seed=2)}
    models["g1"].adapters["backward"] = QueryInterpolation(ChartMap(align, "cosine", 1.0, "cosine", 1.0), 0.7)
    parents = {"g0": None, "g1": "g0"}
    first, second = np.arange(0, 25), np.arange(25, n)
    shards = [shard_record(tmp_path, 0, "g0", ids[first], old[first]),
              shard_record(tmp_path, 1, "g1", ids[second], new[second])]
    router = SearchRouter("g1", models, parents, shards, None, ShardIndex.load)
    others = {"g0": torch.from_numpy(old)}  # the old generation's embeddings of the same items (the queries)
    searched = evaluate_search(router, torch.from_numpy(new), labels, ids, labels, query_ids=ids, ks=(1, 5),
                               queries_by_generation=others)
    as_files = [ShardEmbeddings(ids[p], labels[p], e[p], np.full(len(p), np.nan, np.float32), g, "cosine", 1.0)
                for p, e, g in ((first, old, "g0"), (second, new, "g1"))]
    expected = evaluate_mixed_gallery("g1", torch.from_numpy(new), labels, ids, as_files, models, parents, ks=(1, 5),
                                      queries_by_generation=others)
    assert searched.result.cmc == pytest.approx(expected.cmc)
    assert searched.result.mean_ap == pytest.approx(expected.mean_ap)
