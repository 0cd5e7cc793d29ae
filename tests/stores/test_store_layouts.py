"""What a store row holds besides its searched coordinates, on a real PostgreSQL server and real
Lance datasets: the raw embeddings a forward path maps through F (read from the store, its hits
those of the shard files), a digest covering every column (a changed ``search`` or ``raw`` value
is caught), and rows written by the earlier layout (``embedding`` alone): refused in one line
naming them and the command, migrated in place by ``verify --migrate-stores``, then served."""
from __future__ import annotations

import re
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pytest
import torch

from orchestrator.gallery import write_shard
from orchestrator.index import ShardIndex, build_index
from orchestrator.integrity import IntegrityError
from orchestrator.lineage import LineageStore
from orchestrator.lineage.records import ShardRecord
from orchestrator.lineage.step_keys import StepKind, deploy_key, integrity_key, shard_update_key
from orchestrator.methods import create_method
from orchestrator.methods.fct import build_forward_map
from orchestrator.search import SearchRouter
from orchestrator.stores import StoreLocation, read_checked_embeddings, store_at
from orchestrator.stores.lance import LanceStore
from orchestrator.stores.migrate import migrate_stores
from orchestrator.stores.pgvector import PgVectorStore, index_name
from orchestrator.stores.vectors import EarlierLayout, rows_digest
from test_pgvector_store import libpq, recall_at_10, shard, spread_points
from vector_models import vector_model

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def make_store(kind: str, tmp_path, postgres_url, index: str = "exact", options=None):
    if kind == "pgvector":
        return PgVectorStore(libpq(postgres_url), "orchestrator_test", index, dict(options or {}), overfetch=4)
    return LanceStore(str(tmp_path / "lance"), {"hnsw": "ivf_pq"}.get(index, index), dict(options or {}), overfetch=4)


@pytest.fixture(params=["pgvector", "lance"])
def kind(request):
    return request.param


@pytest.fixture
def url(kind, request):
    return request.getfixturevalue("postgres_url") if kind == "pgvector" else None


def stored_in_both(tmp_path, gallery_store, rows, lineage, position=0):
    """``rows`` written as shard ``position`` into the store and as its Parquet file, the store's
    record in ``lineage``: (the shard row naming the store's rows, the same shard on files only)."""
    uri, record = gallery_store.write_shard(position, rows, shard_update_key(StepKind.EMBED, "test", position,
                                                                             rows.generation), True)
    lineage.commit_step(integrity_key(uri), record)
    parquet = str(tmp_path / f"shard-{position}.parquet")
    digest = write_shard(parquet, rows)
    index_file = str(tmp_path / f"shard-{position}.index")
    build_index(rows.embeddings, rows.space, "flat", rows.ids, curv=rows.curv).save(index_file)
    in_store = ShardRecord("gallery", position, len(rows.ids), rows.generation, parquet, uri, digest, NOW)
    in_files = ShardRecord("gallery", position, len(rows.ids), rows.generation, parquet, index_file, digest, NOW)
    return in_store, in_files


def fct_models():
    torch.manual_seed(5)
    models = {"g0": vector_model(create_method("independent", {}), 6, 9, 3, seed=0),
              "g1": vector_model(create_method("fct", {}), 6, 9, 3, seed=1)}
    models["g1"].adapters["forward_map"] = build_forward_map(9, 9, "mlp", 16, True)
    return models, {"g0": None, "g1": "g0"}


def test_a_forward_path_shard_is_read_from_the_store_with_the_shard_files_hits(tmp_path, kind, url):
    """g1 (FCT) serves; g0's cosine shard is reached through F. Read from the store's ``raw``
    column, its mapped index answers exactly what the shard file's does; the raw embeddings are the
    file's, byte for byte (its ``embedding`` column holds the normalised rows, which F does not take)."""
    lineage = LineageStore(f"sqlite:///{tmp_path / 'lineage.db'}")
    gallery_store = make_store(kind, tmp_path, url)
    rows = shard("cosine", n=300, generation="g0")
    rows = type(rows)(rows.ids, rows.labels, rows.embeddings * 3.0, rows.uncertainty, "g0", "cosine", 1.0,
                      attributes=rows.attributes)  # norms ≠ 1: F of the normalised rows would differ
    own = shard("cosine", n=200, seed=3, generation="g1")
    own = type(own)(own.ids + 10_000, own.labels, own.embeddings, own.uncertainty, "g1", "cosine", 1.0)
    old_store, old_files = stored_in_both(tmp_path, gallery_store, rows, lineage, 0)
    new_store, new_files = stored_in_both(tmp_path, gallery_store, own, lineage, 1)
    ids, raw = read_checked_embeddings(lineage, old_store)
    order = np.argsort(rows.ids)
    np.testing.assert_array_equal(ids, rows.ids[order])
    np.testing.assert_array_equal(raw, rows.embeddings[order])
    models, parents = fct_models()
    from_store = SearchRouter("g1", models, parents, [old_store, new_store], None,
                              lambda uri: store_at(uri, lineage.committed_outputs(integrity_key(uri))).open_shard(
                                  uri, lineage.committed_outputs(integrity_key(uri))),
                              read_embeddings=lambda s: read_checked_embeddings(lineage, s))
    from_files = SearchRouter("g1", models, parents, [old_files, new_files], None, ShardIndex.load)
    assert from_store.paths()["g0"].startswith("gallery mapped by the forward map F")
    queries = torch.from_numpy(np.random.default_rng(4).normal(size=(20, 9)).astype(np.float32))
    expected, found = from_files.search(queries, 10), from_store.search(queries, 10)
    np.testing.assert_array_equal(found.ids, expected.ids)
    np.testing.assert_allclose(found.distances, expected.distances, rtol=1e-9, atol=1e-12)
    assert set(found.generations().ravel()) == {"g0", "g1"}


def change_one_value(kind, gallery_store, uri, column, item):
    """Double ``column`` of row ``item`` at ``uri``, behind the store's back."""
    location = StoreLocation.parse(uri)
    if kind == "pgvector":
        import psycopg

        with psycopg.connect(gallery_store.url) as connection:
            connection.execute(f'UPDATE "{location.table}" SET "{column}" = "{column}" + "{column}" WHERE id = %s',
                               (item,))
        return
    import lance

    dataset = lance.dataset(f"{gallery_store.path}/{location.table}")
    row = dataset.to_table(filter=f"id = {item}")
    values = row.column(column).combine_chunks().flatten().to_numpy() * 2
    row = row.set_column(row.schema.get_field_index(column), column,
                         pa.FixedSizeListArray.from_arrays(pa.array(values.astype(np.float32)), len(values)))
    dataset.delete(f"id = {item}")
    lance.write_dataset(row, f"{gallery_store.path}/{location.table}", mode="append")


@pytest.mark.parametrize("column", ["search", "raw", "embedding"])
def test_verify_digest_covers_every_column(tmp_path, kind, url, column):
    gallery_store = make_store(kind, tmp_path, url, "ivfflat" if kind == "pgvector" else "ivf_pq",
                               {"lists": 4, "num_partitions": 4})
    rows = shard("lorentz", n=400, dim=9)
    uri, record = gallery_store.write_shard(0, rows, "embed:test/0:g1", True)
    assert record["columns"] == ["embedding", "search", "raw"]
    gallery_store.check_shard(uri, record)
    change_one_value(kind, gallery_store, uri, column, int(rows.ids[11]))
    with pytest.raises(IntegrityError, match="rows changed since they were written"):
        gallery_store.check_shard(uri, record)


def index_of(definitions, location, index):
    """The definition among ``definitions`` of the index ``index_name`` names for ``location``."""
    return next((d for d in definitions if f"INDEX {index_name(location, index)} " in d), None)


def make_earlier_layout(kind, gallery_store, uri, record, rows):
    """Rewrite the rows at ``uri`` as the earlier layout held them: ``embedding`` alone (pgvector:
    the approximate index on it), the record without ``columns``, its digest over ``embedding``."""
    location = StoreLocation.parse(uri)
    if kind == "pgvector":
        import psycopg

        with psycopg.connect(gallery_store.url) as connection:
            connection.execute(f'ALTER TABLE "{location.table}" DROP COLUMN search, DROP COLUMN raw')
            connection.execute(f'CREATE INDEX "{location.table}_{gallery_store.index}" ON "{location.table}" '
                               "USING ivfflat (embedding vector_ip_ops) WITH (lists = 16)")
    else:
        import lance

        path = f"{gallery_store.path}/{location.table}"
        lance.write_dataset(lance.dataset(path).to_table().drop_columns(["search", "raw"]), path, mode="overwrite")
    ids, columns = gallery_store.read_rows(uri, ["embedding"])
    earlier = {key: value for key, value in record.items() if key != "columns"}
    return {**earlier, "sha256": rows_digest(ids, columns["embedding"])}


def test_rows_of_the_earlier_layout_are_refused_in_one_line_then_migrated_in_place(tmp_path, kind, url):
    index = "ivfflat" if kind == "pgvector" else "ivf_pq"
    gallery_store = make_store(kind, tmp_path, url, index, {"lists": 16, "probes": 4, "num_partitions": 16, "nprobes": 4})
    rows = shard("lorentz", n=5000, dim=33, embeddings=spread_points("lorentz", 5000, 33, 0))
    lineage = LineageStore(f"sqlite:///{tmp_path / 'lineage.db'}")
    shard_row, _files = stored_in_both(tmp_path, gallery_store, rows, lineage, 0)
    uri = shard_row.index_uri
    old = make_earlier_layout(kind, gallery_store, uri, lineage.committed_outputs(integrity_key(uri)), rows)
    lineage.commit_step(integrity_key(uri), old)
    table = StoreLocation.parse(uri).table
    refusal = re.escape("written by an earlier layout without the column(s)")
    command = re.escape("run `orchestrator verify FILE --migrate-stores`")
    with pytest.raises(EarlierLayout, match=f"{table}.*{refusal} search .*{command}"):
        gallery_store.open_shard(uri, old)
    with pytest.raises(EarlierLayout, match=f"{table}.*{refusal} raw .*{command}"):
        read_checked_embeddings(lineage, shard_row)
    with pytest.raises(EarlierLayout, match=f"{table}.*{refusal} search, raw .*{command}"):
        gallery_store.check_shard(uri, old)  # intact (its digest holds), but not searchable as it is
    with pytest.raises(EarlierLayout, match=f"{table}: {refusal} search, raw .*; {command}"):
        gallery_store.write_shard(1, shard("lorentz", n=50, dim=33, seed=9), "embed:test/1:g1", True)

    lineage.commit_step(deploy_key("g1"), {"shards": [{"index": 0, "index_uri": uri, "n_items": len(rows.ids),
                                                         "embeddings_uri": shard_row.embeddings_uri,
                                                         "sha256": shard_row.sha256, "generation": "g1"}]})
    assert migrate_stores(lineage) == [f"migrated {StoreLocation.parse(uri).describe()}: added search, raw"]
    assert migrate_stores(lineage) == []  # nothing left on the earlier layout
    record = lineage.committed_outputs(integrity_key(uri))
    assert record["columns"] == ["embedding", "search", "raw"]
    gallery_store.check_shard(uri, record)
    ids, raw = read_checked_embeddings(lineage, shard_row)
    np.testing.assert_array_equal(raw, rows.embeddings[np.argsort(rows.ids)])
    queries = spread_points("lorentz", 50, 33, seed=9).astype(np.float64)
    _d, found = gallery_store.open_shard(uri, record).search(queries, 10)
    _e, exact = build_index(rows.embeddings, "lorentz", "flat", rows.ids).search(queries, 10)
    assert recall_at_10(found, exact) >= 0.95, recall_at_10(found, exact)
    if kind == "pgvector":
        import psycopg

        with psycopg.connect(gallery_store.url) as connection:
            definitions = [row[0] for row in connection.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s "
                                                                "AND indexdef LIKE '%%ivfflat%%'", (table,))]
        assert definitions == [index_of(definitions, StoreLocation.parse(uri), index)], definitions
        assert "(search vector_ip_ops)" in definitions[0] and f"version = '{StoreLocation.parse(uri).version}'" \
            in definitions[0], definitions  # the shard update's own index, on search; the earlier one dropped
    else:
        assert [entry["fields"] for entry in gallery_store.open_shard(uri, record)._dataset.list_indices()] == [["search"]]
