"""How the gallery step cuts its shard updates into read tasks: the task size (a setting, or 128
model batches) and the row ranges each task reads, never across two updates."""
from __future__ import annotations

from orchestrator.config.gallery import EmbeddingSpec
from orchestrator.distributed.gallery_read import RowRange, StoredItems, read_pieces
from orchestrator.distributed.gallery_step import PART_BATCHES, TASK_BLOCKS, read_task_rows
from orchestrator.shard_update import ShardUpdate, UpdateKind


def test_a_task_is_128_model_batches_unless_the_setting_says_otherwise():
    assert TASK_BLOCKS * PART_BATCHES == 128
    assert read_task_rows(EmbeddingSpec(), PART_BATCHES * 256) == 32_768
    assert read_task_rows(EmbeddingSpec(batch_size=512), PART_BATCHES * 512) == 65_536
    assert read_task_rows(EmbeddingSpec(batch_size=512, rows_per_task=500_000), PART_BATCHES * 512) == 500_000


def test_each_update_is_cut_into_tasks_of_at_most_the_task_size_covering_its_rows_once():
    updates = [ShardUpdate(UpdateKind.EMBED, 0, 50_000, rows=(0, 50_000)),
               ShardUpdate(UpdateKind.EMBED, 1, 20_000, rows=(50_000, 70_000)),
               ShardUpdate(UpdateKind.EMBED, 2, 300, source=("s3://b/shard-2.parquet", "ab" * 32))]
    pieces = read_pieces(updates, 32_768)
    assert pieces == [RowRange(0, 0, 32_768), RowRange(0, 32_768, 50_000), RowRange(1, 50_000, 70_000),
                      StoredItems(2, "s3://b/shard-2.parquet", "ab" * 32, None, 300)]
    for size in (1, 7, 10_000, 50_000, 10**6):
        ranges = [p for p in read_pieces(updates[:2], size) if isinstance(p, RowRange)]
        assert all(0 < p.num_rows <= size for p in ranges)
        covered = [row for p in ranges for row in range(p.start, p.stop)]
        assert covered == list(range(70_000))  # every row once, in order
        assert all(updates[p.entry].rows[0] <= p.start < p.stop <= updates[p.entry].rows[1] for p in ranges)
