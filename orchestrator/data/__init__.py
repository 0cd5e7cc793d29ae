"""Datasets and update scenarios: labelled image sets, their sources, and old/new training selections."""
from orchestrator.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "images": ["LabeledImages", "channel_statistics"],
    "tensors": ["ImageTensorDataset"],
    "scenarios": [
        "Scenario", "class_increment_splits", "cumulative_classes", "extended_class",
        "extended_data", "first_classes", "first_per_class", "scenario_indices", "select_classes",
        "stratified_sample",
    ],
    "procedural": ["load_shapes"],
    "registry": ["SOURCE_NAMES", "load_source"],
    "selection": ["training_indices"],
    "sources": [
        "IMAGE_EXTENSIONS", "download_cifar", "load_cifar", "load_digits", "load_image_folder",
        "load_parquet", "load_tiny_imagenet", "safe_extract_tar",
    ],
})
