"""The pgvector store on a real PostgreSQL server (the ``vector`` extension the test server ships):
exact search gives the shard index's hits and distances in every space (Lorentz through the inner
product with the first coordinate's sign flipped), HNSW/IVFFlat (used by the planner) with
over-fetch and exact re-rank recall what exact search finds on Euclidean and cosine galleries, and
on Lorentz and Poincaré galleries through the rows' MIPS→L2 search coordinates, a changed or
missing row is caught by the digest, staged rows are listed and removed, the first attempt never
replaces rows, and a database that does not answer is one line naming the store (no password),
picklable across a Ray worker."""
from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

from benchmarks.stores import gallery_points
from orchestrator.errors import OutsideSystemError
from orchestrator.gallery.shard_files import ShardEmbeddings
from orchestrator.geometry.geometry import Geometry
from orchestrator.index import build_index
from orchestrator.integrity import IntegrityError
from orchestrator.lineage.step_keys import StepKind, shard_update_key
from orchestrator.storage.overwrite import UnknownArtefact
from orchestrator.stores import StoreLocation, store_at
from orchestrator.stores.pgvector import PgVectorStore, index_name
from orchestrator.stores.vectors import query_coordinates, search_rows, stored_coordinates


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def points(space: str, n: int, dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)) * (0.6 if space != "poincare" else 0.1)
    if space == "lorentz":
        spatial = x[:, 1:]
        x[:, 0] = np.sqrt(1.0 + (spatial ** 2).sum(axis=1))
    if space == "poincare":
        x = x / (1.0 + np.linalg.norm(x, axis=1, keepdims=True))
    return x.astype(np.float32)


def spread_points(space: str, n: int, dim: int, seed: int) -> np.ndarray:
    """Hyperbolic points spread as the benchmarks' gallery (``exp_0`` of Gaussian tangent vectors,
    ``dim`` Lorentz coordinates), on which an index over the raw hyperboloid coordinates recalls
    poorly (pgvector HNSW: 0.02 at 10⁵); Poincaré: the same points in the ball, ``x_s / (1 + x_t)``."""
    x = gallery_points(n, dim, seed).astype(np.float64)
    return (x[:, 1:] / (1.0 + x[:, :1]) if space == "poincare" else x).astype(np.float32)


def shard(space: str, n: int = 600, dim: int = 9, seed: int = 0, generation: str = "g1",
          embeddings: np.ndarray | None = None) -> ShardEmbeddings:
    ids = np.random.default_rng(seed + 1).permutation(10 * n)[:n].astype(np.int64)
    embeddings = points(space, n, dim, seed) if embeddings is None else embeddings
    return ShardEmbeddings(ids, ids % 10, embeddings, np.zeros(n, np.float32), generation, space, 1.0,
                           attributes=pa.table({"uri": [f"item://{i}" for i in ids]}))


def recall_at_10(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact)]))


@pytest.mark.parametrize("space", ["lorentz", "euclidean", "cosine", "poincare"])
def test_exact_search_returns_the_flat_shard_index_hits_and_distances(postgres_url, space):
    store = PgVectorStore(libpq(postgres_url), "orchestrator_test")
    rows = shard(space)
    uri, record = store.write_shard(3, rows, "embed:test/3:g1", first_attempt=True)
    assert StoreLocation.parse(uri).shard == 3 and record["n_items"] == len(rows.ids)
    found = store_at(uri, record).open_shard(uri, record)
    queries = points(space, 25, 9, seed=7).astype(np.float64)
    distances, ids = found.search(queries, 10)
    expected_distances, expected_ids = build_index(rows.embeddings, space, "flat", rows.ids).search(queries, 10)
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_allclose(distances, expected_distances, rtol=1e-9, atol=1e-12)


def test_the_lorentz_inner_product_is_the_flipped_euclidean_one():
    """docs/stores.md: ``[-q_t, q_s] · [x_t, x_s] = <q, x>_L``, and the geodesic distance falls as it grows."""
    x, q = points("lorentz", 50, 6, 1).astype(np.float64), points("lorentz", 1, 6, 2).astype(np.float64)
    coords, searched = query_coordinates(q, "lorentz", 1.0)
    stored = stored_coordinates(x, "lorentz", 1.0).astype(np.float64)
    lorentz = -stored[:, 0] * coords[0, 0] + stored[:, 1:] @ coords[0, 1:]
    np.testing.assert_allclose(stored @ searched[0].astype(np.float64), lorentz, rtol=1e-5)
    geodesic = Geometry("lorentz", 1.0).coordinate_distance(np.broadcast_to(coords[0], stored.shape), stored,
                                                             hyperbolic_model="lorentz")
    assert (np.argsort(-lorentz) == np.argsort(geodesic)).mean() > 0.95  # float32 ties aside, the same order


def test_search_coordinates_put_a_shard_on_one_sphere_where_inner_product_order_is_geodesic_order():
    """stores.vectors: ``[x_t, x_s, sqrt(M² − |x|²)]`` has norm ``M`` for every row, and with the
    query ``[-q_t, q_s, 0]`` both its inner product and its L2 distance rank the rows as the
    geodesic distance does."""
    x = spread_points("lorentz", 300, 9, seed=1)
    stored = stored_coordinates(x, "lorentz", 1.0)
    search = search_rows(stored).astype(np.float64)
    norms = np.linalg.norm(search, axis=1)
    np.testing.assert_allclose(norms, np.sqrt((stored.astype(np.float64) ** 2).sum(axis=1).max()), rtol=1e-6)
    np.testing.assert_array_equal(search[:, :-1], stored.astype(np.float64))
    coords, searched = query_coordinates(spread_points("lorentz", 1, 9, seed=2), "lorentz", 1.0, "hnsw")
    assert searched.shape == (1, 10) and searched[0, -1] == 0.0
    geodesic = Geometry("lorentz", 1.0).coordinate_distance(np.broadcast_to(coords[0], stored.shape),
                                                             stored.astype(np.float64), hyperbolic_model="lorentz")
    by_inner_product = np.argsort(-(search @ searched[0].astype(np.float64)), kind="stable")
    by_l2 = np.argsort(np.linalg.norm(search - searched[0].astype(np.float64), axis=1), kind="stable")
    assert (by_inner_product == np.argsort(geodesic, kind="stable")).mean() > 0.95  # float32 ties aside
    assert (by_l2 == np.argsort(geodesic, kind="stable")).mean() > 0.95


@pytest.mark.parametrize("space", ["euclidean", "cosine"])
@pytest.mark.parametrize("index,options", [("hnsw", {"m": 16, "ef_construction": 64}), ("ivfflat", {"lists": 20, "probes": 10})])
def test_approximate_indexes_are_used_and_recall_with_overfetch_and_exact_rerank(postgres_url, index, options, space):
    """The shard update's own index is built after its rows are written, the planner uses it for
    the shard's search (its statistics taken), and the re-ranked hits recall the exact ones."""
    import psycopg

    store = PgVectorStore(libpq(postgres_url), "orchestrator_test", index, options, overfetch=4)
    rows = shard(space, n=2000, dim=17)
    uri, record = store.write_shard(0, rows, "embed:test/0:g1", first_attempt=True)
    found = store.open_shard(uri, record)
    assert found.kind == {"hnsw": "hnsw", "ivfflat": "ivf"}[index]
    location = StoreLocation.parse(uri)
    operator = "<->" if space == "euclidean" else "<#>"
    with psycopg.connect(libpq(postgres_url)) as connection:
        plan = "\n".join(r[0] for r in connection.execute(
            f"EXPLAIN SELECT id FROM \"{location.table}\" WHERE shard = 0 AND version = '{location.version}' "
            f"ORDER BY embedding {operator} %s::vector LIMIT 40", ("[" + ",".join(["0.1"] * 17) + "]",)))
    assert index_name(location, index) in plan, plan
    queries = points(space, 50, 17, seed=9).astype(np.float64)
    _d, ids = found.search(queries, 10)
    _e, exact = build_index(rows.embeddings, space, "flat", rows.ids).search(queries, 10)
    assert recall_at_10(ids, exact) >= 0.9, recall_at_10(ids, exact)


@pytest.mark.parametrize("space", ["lorentz", "poincare"])
@pytest.mark.parametrize("index,options", [("hnsw", {"m": 16, "ef_construction": 64}), ("ivfflat", {"lists": 40, "probes": 5})])
def test_approximate_indexes_on_hyperbolic_galleries_search_the_mips_coordinates(postgres_url, index, options, space):
    """Two shards in one table, each on its own sphere (its own ``M``) with its own index on
    ``search``, used for its search, and each shard's
    re-ranked hits recall the exact ones: at least 0.95 (measured 0.98-1.0; the same index on the
    raw ``embedding`` with ``vector_ip_ops`` recalled 0.02 (HNSW) and 0.38-0.40 (IVFFlat) here)."""
    import psycopg

    store = PgVectorStore(libpq(postgres_url), "orchestrator_test", index, options, overfetch=4)
    rows = [shard(space, n=2500, seed=seed, embeddings=spread_points(space, 2500, 33, seed)) for seed in (0, 1)]
    written = [store.write_shard(position, part, shard_update_key(StepKind.EMBED, "test", position, "g1"), first_attempt=True)
               for position, part in enumerate(rows)]
    table = StoreLocation.parse(written[0][0]).table
    with psycopg.connect(libpq(postgres_url)) as connection:
        for uri, _record in written:
            location = StoreLocation.parse(uri)
            plan = "\n".join(r[0] for r in connection.execute(
                f"EXPLAIN SELECT id FROM \"{table}\" WHERE shard = {location.shard} AND version = '{location.version}' "
                "ORDER BY search <#> %s::vector LIMIT 40", ("[" + ",".join(["0.1"] * 34) + "]",)))
            assert index_name(location, index) in plan, plan
    queries = spread_points(space, 50, 33, seed=9).astype(np.float64)
    for part, (uri, record) in zip(rows, written):
        _d, ids = store.open_shard(uri, record).search(queries, 10)
        _e, exact = build_index(part.embeddings, space, "flat", part.ids).search(queries, 10)
        assert recall_at_10(ids, exact) >= 0.95, recall_at_10(ids, exact)
    store.remove([written[1][0]])  # gc: the rows and their index
    with psycopg.connect(libpq(postgres_url)) as connection:
        names = {row[0] for row in connection.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", (table,))}
    assert names == {f"{table}_pkey", index_name(StoreLocation.parse(written[0][0]), index)}, names


def test_verify_catches_a_changed_vector_and_a_missing_row(postgres_url):
    import psycopg

    store = PgVectorStore(libpq(postgres_url), "orchestrator_test")
    rows = shard("lorentz")
    uri, record = store.write_shard(1, rows, "embed:test/1:g1", first_attempt=True)
    store.check_shard(uri, record)
    location = StoreLocation.parse(uri)
    with psycopg.connect(libpq(postgres_url)) as connection:
        connection.execute(f'UPDATE "{location.table}" SET embedding = embedding + embedding WHERE id = %s',
                           (int(rows.ids[5]),))
    with pytest.raises(IntegrityError, match="rows changed since they were written"):
        store.check_shard(uri, record)
    with psycopg.connect(libpq(postgres_url)) as connection:
        connection.execute(f'DELETE FROM "{location.table}" WHERE id = %s', (int(rows.ids[7]),))
    with pytest.raises(IntegrityError, match="rows missing or added"):
        store.check_shard(uri, record)
    with pytest.raises(IntegrityError, match="holds 599 rows, the lineage recorded 600"):
        store.open_shard(uri, record)


def test_rows_are_written_once_and_staged_rows_listed_and_removed(postgres_url):
    store = PgVectorStore(libpq(postgres_url), "orchestrator_test")
    rows = shard("euclidean")
    uri, record = store.write_shard(2, rows, "embed:test/2:g1", first_attempt=True)
    with pytest.raises(UnknownArtefact, match="first attempt"):
        store.write_shard(2, rows, "embed:test/2:g1", first_attempt=True)
    again, _ = store.write_shard(2, rows, "embed:test/2:g1", first_attempt=False)  # a later attempt replaces them
    assert again == uri and store.count(uri) == len(rows.ids)
    other, _ = store.write_shard(2, shard("euclidean", seed=5), "embed:test/2:g2", first_attempt=True)
    assert store.locations() == sorted([uri, other])
    store.remove([other])
    assert store.locations() == [uri] and store.count(other) == 0


def test_a_database_that_does_not_answer_is_one_line_naming_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "s3cret-pw")
    store = PgVectorStore(f"postgresql://reader@/gallery?host={tmp_path}", "orchestrator_test")
    with pytest.raises(OutsideSystemError) as caught:
        store.write_shard(0, shard("euclidean", n=20), "embed:test/0:g1", first_attempt=True)
    message = str(caught.value)
    assert message.startswith(f"PostgreSQL (pgvector store) at postgresql://reader@/gallery?host={tmp_path}: ")
    assert "\n" not in message and "s3cret" not in message
    copied = pickle.loads(pickle.dumps(caught.value))  # it crosses from a Ray worker to the driver
    assert isinstance(copied, OutsideSystemError) and str(copied) == message


def assert_same_hits_up_to_ties(distances, ids, expected_distances, expected_ids, rtol=1e-9):
    """Equal distances row by row, and the same ids among those strictly nearer than the k-th
    distance (Hamming distances tie: which of the tied items fills the last slots is arbitrary)."""
    np.testing.assert_allclose(distances, expected_distances, rtol=rtol, atol=1e-12)
    for found, expected, row, last in zip(ids, expected_ids, distances, distances[:, -1]):
        assert set(found[row < last]) == set(expected[row < last])


@pytest.mark.parametrize("space", ["lorentz", "euclidean"])
@pytest.mark.parametrize("kind,options", [("binary", {}), ("binary_weighted", {"bits": 3}),
                                          ("binary_two_stage", {"rerank_factor": 80}),
                                          ("binary_two_stage", {"rerank": "float", "rerank_factor": 80})])
def test_binary_kinds_are_bit_codes_searched_by_hamming_distance_as_the_shard_index(postgres_url, kind, options,
                                                                                     space):
    """``gallery.index`` binary kinds in pgvector: the rows carry the shard's bit-plane codes in a
    ``bit`` column searched with ``<~>``, and the hits and distances are the binary shard index's.
    Two-stage: every row a candidate (80 · k = N), so its re-rank, not which of the rows tied in
    Hamming distance at the 10·k-th fill the candidates, is what is compared; its float re-rank is
    the geodesic from float32 Lorentz rows here, from float32 Poincaré rows in the shard index
    (the same distance, rounded apart by ~1e-8)."""
    import psycopg

    store = PgVectorStore(libpq(postgres_url), "orchestrator_test", binary=kind, binary_options=options)
    rows = shard(space, n=800, dim=17)
    uri, record = store.write_shard(0, rows, "embed:test/0:g1", first_attempt=True)
    assert record["binary"]["kind"] == kind
    found = store_at(uri, record).open_shard(uri, record)
    queries = points(space, 30, 17, seed=7).astype(np.float64)
    distances, ids = found.search(queries, 10)
    expected_distances, expected_ids = build_index(rows.embeddings, space, kind, rows.ids, **options).search(queries, 10)
    assert_same_hits_up_to_ties(distances, ids, expected_distances, expected_ids,
                                rtol=1e-6 if options.get("rerank") == "float" else 1e-9)
    location = StoreLocation.parse(uri)
    with psycopg.connect(libpq(postgres_url)) as connection:
        column_type, = connection.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                                          "%s::regclass AND attname = 'code'", (f'"{location.table}"',)).fetchone()
    plane_bits = 8 * -(-(16 if space == "lorentz" else 17) // 8)  # Lorentz: 16 coordinates of the Poincaré ball
    n = options.get("bits", 2)
    assert column_type == f"bit({plane_bits * ((4 ** n - 1) // 3 if kind == 'binary_weighted' else n)})"
    store.check_shard(uri, record)


@pytest.mark.parametrize("index,options", [("hnsw", {"m": 16, "ef_construction": 64}), ("ivfflat", {"lists": 20, "probes": 12})])
def test_an_index_over_the_bit_codes_is_used_and_recalls_the_exact_hamming_hits(postgres_url, index, options):
    """``store.index`` over the codes (``bit_hamming_ops``): what ``binary_ivf`` is in shard files."""
    import psycopg

    store = PgVectorStore(libpq(postgres_url), "orchestrator_test", index, options, binary="binary_weighted")
    rows = shard("lorentz", n=3000, dim=33, embeddings=spread_points("lorentz", 3000, 33, seed=0))
    uri, record = store.write_shard(0, rows, "embed:test/0:g1", first_attempt=True)
    location = StoreLocation.parse(uri)
    with psycopg.connect(libpq(postgres_url)) as connection:
        plan = "\n".join(r[0] for r in connection.execute(
            f"EXPLAIN SELECT id FROM \"{location.table}\" WHERE shard = 0 AND version = '{location.version}' "
            "ORDER BY code <~> %s::bit(640) LIMIT 40", ("0" * 640,)))
    assert index_name(location, index) in plan, plan
    queries = spread_points("lorentz", 50, 33, seed=9).astype(np.float64)
    distances, _ids = store.open_shard(uri, record).search(queries, 10)
    expected, _ = build_index(rows.embeddings, "lorentz", "binary_weighted", rows.ids).search(queries, 10)
    assert np.mean(distances <= expected[:, -1:]) >= 0.95  # recall@10 of the exact top-10's distances
