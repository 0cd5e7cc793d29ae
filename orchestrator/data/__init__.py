"""Datasets and update scenarios: labelled image sets, their sources, and old/new training selections."""
from orchestrator.data.images import ImageTensorDataset, LabeledImages, channel_statistics
from orchestrator.data.scenarios import (
    Scenario,
    class_increment_splits,
    cumulative_classes,
    extended_class,
    extended_data,
    first_classes,
    first_per_class,
    scenario_indices,
    select_classes,
    stratified_sample,
)
from orchestrator.data.procedural import load_shapes
from orchestrator.data.registry import SOURCE_NAMES, load_source
from orchestrator.data.selection import training_indices
from orchestrator.data.sources import (
    IMAGE_EXTENSIONS,
    download_cifar,
    load_cifar,
    load_digits,
    load_image_folder,
    load_parquet,
    load_tiny_imagenet,
    safe_extract_tar,
)

__all__ = [
    "IMAGE_EXTENSIONS",
    "SOURCE_NAMES",
    "ImageTensorDataset",
    "LabeledImages",
    "Scenario",
    "channel_statistics",
    "class_increment_splits",
    "cumulative_classes",
    "download_cifar",
    "extended_class",
    "extended_data",
    "first_classes",
    "first_per_class",
    "load_cifar",
    "load_digits",
    "load_image_folder",
    "load_parquet",
    "load_shapes",
    "load_source",
    "load_tiny_imagenet",
    "safe_extract_tar",
    "scenario_indices",
    "select_classes",
    "stratified_sample",
    "training_indices",
]
