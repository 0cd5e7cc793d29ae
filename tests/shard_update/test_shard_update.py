"""One shard update without Ray (``orchestrator.shard_update``): the files it writes hold exactly the
planned items embedded as the local evaluation path embeds them, its index record is the record of
the bytes on disk, a split keeps every item in exactly one of its two shards, and a first attempt
never overwrites a file the lineage does not know."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from orchestrator.data import ImageTensorDataset, channel_statistics, load_digits
from orchestrator.data.gallery_sources import MemorySource, decode_images
from orchestrator.gallery import read_shard
from orchestrator.index import load_index
from orchestrator.integrity import index_record
from orchestrator.methods import create_method, embed_dataset
from orchestrator.models.encoder import EncoderConfig
from orchestrator.shard_update import PixelEmbedder, ShardTarget, ShardUpdate, UpdateKind, run_shard_update
from orchestrator.shard_update.parts import read_parts, write_parts
from orchestrator.storage import filesystem, read_bytes
from orchestrator.storage.overwrite import UnknownArtefact

IMAGE_SIZE = 32


@pytest.fixture(scope="module")
def digits():
    torch.manual_seed(0)
    method = create_method("hbct")
    model = method.build_model(EncoderConfig(arch="test_resnet", embed_dim=8), 10, range(10)).eval()
    gallery = load_digits("test")
    mean, std = channel_statistics(load_digits("train"))
    return model, MemorySource(gallery, "digits:test"), mean, std


def embed_rows(source: MemorySource, embedder: PixelEmbedder):
    return lambda block: embedder(decode_images(block.column("image"), source.image_format, IMAGE_SIZE))


def blocks_of(source: MemorySource, start: int, stop: int, block_rows: int = 50):
    return [b for f, lo, hi in source.pieces(start, stop) for b in source.reader(f).blocks(lo, hi, None, block_rows)]


def started(kind: UpdateKind, shard: int, num_items: int, generation: str = "g0", first_attempt: bool = True,
            source: tuple[str, str] | None = None, **planned) -> ShardUpdate:
    """An update of gallery ``photos`` as its step's run carries it."""
    update = ShardUpdate(kind, shard, num_items, **planned)
    return update.started(update.step_key("photos", generation), first_attempt, source)


def run(update, source, embedder, target, blocks):
    return run_shard_update(update, blocks, embed_rows(source, embedder), "g0", "lorentz", 1.0, target,
                            batch_size=32)


def test_an_update_writes_the_planned_items_as_the_local_path_embeds_them(digits, tmp_path):
    model, source, mean, std = digits
    embedder = PixelEmbedder(model, IMAGE_SIZE, mean, std)
    target = ShardTarget(str(tmp_path / "gallery"), "flat")
    update = started(UpdateKind.EMBED, 1, 140, rows=(100, 240))
    assert update.key == "embed:photos/1:g0" and update.first_attempt
    result = run(update, source, embedder, target, blocks_of(source, 100, 240))

    written, = result.written
    shard = read_shard(written.embeddings_uri, expected_sha256=written.sha256)
    rows = np.arange(100, 240)
    expected_ids = np.sort(source.images.ids[rows])
    assert np.array_equal(shard.ids, expected_ids) and np.array_equal(np.sort(shard.rows), rows)
    local, labels = embed_dataset(model, ImageTensorDataset(source.images.subset(rows), IMAGE_SIZE, mean, std))
    order = np.argsort(source.images.ids[rows])
    np.testing.assert_allclose(shard.embeddings, local.embedding.numpy()[order], atol=1e-5)
    np.testing.assert_array_equal(shard.labels, labels.numpy()[order])
    assert written.index_record == index_record(read_bytes(written.index_uri), expected_ids)
    assert load_index(written.index_uri).ntotal == 140
    # what goes back to the driver: a few hundred bytes, however many items the shard holds
    assert len(pickle.dumps(result)) < 2000


def test_a_split_keeps_every_item_in_exactly_one_shard(digits, tmp_path):
    model, source, mean, std = digits
    embedder = PixelEmbedder(model, IMAGE_SIZE, mean, std)
    target = ShardTarget(str(tmp_path / "gallery"), "flat")
    whole = run(started(UpdateKind.EMBED, 0, 100, rows=(0, 100)), source, embedder, target,
                blocks_of(source, 0, 100)).written[0]
    moved_rows = np.arange(0, 100, 3)
    moved_blocks = [block for block in blocks_of(source, 0, 100) for block in
                    [block.filter(np.isin(block.column("row").to_numpy(), moved_rows))] if len(block)]
    split = started(UpdateKind.SPLIT, 0, moved_rows.size, "g1", target=7, source=(whole.embeddings_uri, whole.sha256))
    kept, new = run_shard_update(split, moved_blocks, embed_rows(source, embedder), "g1", "lorentz", 1.0, target,
                                 batch_size=32).written
    assert (kept.shard, kept.generation, new.shard, new.generation) == (0, "g0", 7, "g1")
    kept_ids, new_ids = read_shard(kept.embeddings_uri).ids, read_shard(new.embeddings_uri).ids
    assert np.array_equal(np.sort(np.concatenate([kept_ids, new_ids])), read_shard(whole.embeddings_uri).ids)
    assert np.array_equal(np.sort(new_ids), np.sort(source.images.ids[moved_rows]))
    assert kept.n_items + new.n_items == 100


def test_items_other_than_the_planned_ones_are_refused(digits, tmp_path):
    model, source, mean, std = digits
    embedder = PixelEmbedder(model, IMAGE_SIZE, mean, std)
    target = ShardTarget(str(tmp_path / "gallery"), "flat")
    short = started(UpdateKind.EMBED, 0, 100, rows=(0, 100))
    with pytest.raises(RuntimeError, match="not exactly the planned ones .99 rows"):
        run(short, source, embedder, target, blocks_of(source, 1, 100))
    twice = started(UpdateKind.EMBED, 0, 100, rows=(0, 100))
    with pytest.raises(RuntimeError, match="not exactly the planned ones"):
        run(twice, source, embedder, target, blocks_of(source, 0, 50) + blocks_of(source, 0, 50))
    assert not (tmp_path / "gallery").exists()  # nothing written


def test_a_first_attempt_never_overwrites_an_unknown_file_and_a_later_one_rewrites(digits, tmp_path):
    model, source, mean, std = digits
    embedder = PixelEmbedder(model, IMAGE_SIZE, mean, std)
    target = ShardTarget(str(tmp_path / "gallery"), "flat")
    update = started(UpdateKind.EMBED, 0, 40, rows=(0, 40))
    first = run(update, source, embedder, target, blocks_of(source, 0, 40)).written[0]
    with open(first.embeddings_uri, "wb") as handle:  # something the lineage does not know
        handle.write(b"a user's file")
    with pytest.raises(UnknownArtefact, match="exists but the lineage does not know it"):
        run(update, source, embedder, target, blocks_of(source, 0, 40))
    assert read_bytes(first.embeddings_uri) == b"a user's file"
    again = run(started(UpdateKind.EMBED, 0, 40, first_attempt=False, rows=(0, 40)), source, embedder, target,
                blocks_of(source, 0, 40)).written[0]
    assert again == first  # the same content under the same name


def test_staged_parts_are_written_whole_and_not_fsynced(tmp_path, monkeypatch):
    """A step attempt's parts are read only by that attempt (a crash makes them worthless): no
    fsync, one part per entry, read back equal to the rows staged without ``entry``."""
    import pyarrow as pa

    synced: list[int] = []
    monkeypatch.setattr(filesystem.os, "fsync", synced.append)
    part = pa.table({"entry": pa.array([0, 1, 0], pa.int64()), "id": pa.array([7, 8, 9], pa.int64()),
                     "row": pa.array([0, 1, 2], pa.int64()), "embedding": pa.array(np.ones(3, np.float32))})
    rows = write_parts(part, {0: str(tmp_path / "a"), 1: str(tmp_path / "b")})
    assert synced == []
    assert rows.column("entry").to_pylist() == [0, 1] and rows.column("n_items").to_pylist() == [2, 1]
    staged = read_parts(rows.column("uri").to_pylist())
    assert staged[0].equals(part.filter(pa.array([True, False, True])).drop_columns(["entry"]))
    assert staged[1].column("id").to_pylist() == [8]


def _part(ids, rows):
    """An ``embedded_part`` of items ``ids`` at ``rows`` (embeddings a function of the id, as a
    retried task reproduces them)."""
    import pyarrow as pa

    from orchestrator.shard_update.work import embedded_part

    ids, rows = np.asarray(ids, dtype=np.int64), np.asarray(rows, dtype=np.int64)
    block = pa.table({"row": rows, "id": ids, "label": ids % 10, "uri": [f"s3://b/{i}.png" for i in ids],
                      "entry": np.zeros(len(ids), np.int64)})
    embedding = np.stack([np.random.default_rng(int(i)).normal(size=4) for i in ids]).astype(np.float32)
    return embedded_part(block, embedding, np.full(len(ids), 0.5, np.float32))


@pytest.mark.parametrize("repeat", [False, True])
def test_a_shard_is_its_items_sorted_by_id_whether_or_not_a_retried_part_repeats_some(repeat):
    from orchestrator.shard_update.work import assemble_shard

    rng = np.random.default_rng(3)
    ids = rng.choice(10**9, size=60, replace=False)
    parts = [_part(ids[:25], np.arange(25)), _part(ids[25:], np.arange(25, 60))]
    if repeat:  # a retried task's part reported a second time, with the same items at the same rows
        parts.insert(1, _part(ids[10:25], np.arange(10, 25)))
    update = started(UpdateKind.EMBED, 0, 60, rows=(0, 60))
    shard = assemble_shard(update, parts, "g0", "lorentz", 1.0)
    order = np.argsort(ids)  # independent of the parts' order and of the repeat
    assert shard.ids.tolist() == ids[order].tolist() and shard.rows.tolist() == order.tolist()
    expected = np.stack([np.random.default_rng(int(i)).normal(size=4) for i in ids[order]]).astype(np.float32)
    assert np.array_equal(shard.embeddings, expected)
    assert shard.attributes.column("uri").to_pylist() == [f"s3://b/{i}.png" for i in ids[order]]


def test_an_id_at_two_rows_is_refused_even_with_every_row_distinct():
    from orchestrator.shard_update.work import assemble_shard

    parts = [_part([5, 6, 7], [0, 1, 2]), _part([5], [3])]  # id 5 at rows 0 and 3
    with pytest.raises(RuntimeError, match=r"not exactly the planned ones \(4 rows, 3 distinct ids, 4 planned\)"):
        assemble_shard(started(UpdateKind.EMBED, 0, 4, rows=(0, 4)), parts, "g0", "lorentz", 1.0)
