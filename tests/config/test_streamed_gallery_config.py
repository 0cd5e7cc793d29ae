"""A streamed gallery in a pipeline file: its options are checked against the source's own
parameters, num_shards / items_per_shard are exclusive, and the shard count follows the items."""
from __future__ import annotations

import pytest

from orchestrator.config import PipelineConfig
from streamed_gallery_case import streamed_config


def test_a_parquet_gallery_validates_and_counts_its_shards():
    gallery = PipelineConfig.model_validate(streamed_config()).gallery
    assert gallery.source == "parquet_dataset" and gallery.options["uri_column"] == "key"
    assert [gallery.shard_count(n) for n in (1, 100, 101, 539)] == [1, 1, 2, 6]


@pytest.mark.parametrize("change, message", [
    (lambda g: g["options"].update(colour="red"), r"gallery.options.colour: unknown option of source 'parquet_dataset'"),
    (lambda g: g["options"].pop("path"), r"gallery.options: source 'parquet_dataset' needs the option\(s\) path"),
    (lambda g: g.update(num_shards=3), r"items_per_shard: give num_shards or items_per_shard, not both"),
    (lambda g: g.update(items_per_shard=0), r"items_per_shard"),
    (lambda g: g.update(source="parquet_folder"), r"unknown data source"),
])
def test_bad_streamed_gallery_settings_name_the_field(change, message):
    config = streamed_config()
    change(config["gallery"])
    with pytest.raises(ValueError, match=message):
        PipelineConfig.model_validate(config)
