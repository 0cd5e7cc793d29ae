"""Tiny-ImageNet layout and generic image folders, on small PNG/JPEG trees written with PIL."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from orchestrator.data import load_image_folder, load_source, load_tiny_imagenet

COLOURS = {"n03": (200, 30, 30), "n01": (30, 200, 30), "n02": (30, 30, 200)}


def solid(colour, size=16) -> Image.Image:
    return Image.new("RGB", (size, size), colour)


def make_tiny_imagenet(root: Path, with_words: bool = True) -> None:
    (root / "wnids.txt").write_text("n03\nn01\nn02\n")  # deliberately unsorted
    if with_words:
        words = ["n01\tgoldfish, Carassius auratus", "n02\tbullfrog", "n03\ttabby, tabby cat", "n99\tother"]
        (root / "words.txt").write_text("\n".join(words) + "\n")
    for wnid, colour in COLOURS.items():
        images = root / "train" / wnid / "images"
        images.mkdir(parents=True)
        for i in range(2):
            solid(colour).save(images / f"{wnid}_{i}.JPEG", quality=100)
        (root / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
    val = root / "val" / "images"
    val.mkdir(parents=True)
    annotations = [("val_0.JPEG", "n02"), ("val_1.JPEG", "n03"), ("val_10.JPEG", "n01"), ("val_2.JPEG", "n02")]
    for name, wnid in annotations:
        solid(COLOURS[wnid]).save(val / name, quality=100)
    (root / "val" / "val_annotations.txt").write_text("".join(f"{n}\t{w}\t0\t0\t15\t15\n" for n, w in annotations))


def test_tiny_imagenet_train_uses_sorted_wnids(tmp_path):
    make_tiny_imagenet(tmp_path)
    data = load_tiny_imagenet(tmp_path, "train")
    assert data.images.shape == (6, 16, 16, 3)
    np.testing.assert_array_equal(data.labels, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(data.ids, np.arange(6))
    assert data.class_names == ["goldfish", "bullfrog", "tabby"]
    for label, wnid in enumerate(["n01", "n02", "n03"]):
        pixels = data.images[data.labels == label].reshape(-1, 3).astype(int)
        assert np.abs(pixels - COLOURS[wnid]).max() <= 3  # JPEG round trip of a solid colour


def test_tiny_imagenet_val_follows_annotations(tmp_path):
    make_tiny_imagenet(tmp_path, with_words=False)
    data = load_source("tiny_imagenet", root=tmp_path, split="val", image_size=8)
    np.testing.assert_array_equal(data.labels, [1, 2, 0, 1])
    np.testing.assert_array_equal(data.ids, 100_000 + np.arange(4))
    assert data.class_names == ["n01", "n02", "n03"] and data.images.shape == (4, 8, 8, 3)
    assert np.abs(data.images[2].reshape(-1, 3).astype(int) - COLOURS["n01"]).max() <= 3


def test_tiny_imagenet_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="wnids.txt"):
        load_tiny_imagenet(tmp_path)
    make_tiny_imagenet(tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_tiny_imagenet(tmp_path, "test")
    with open(tmp_path / "val" / "val_annotations.txt", "a") as out:
        out.write("val_3.JPEG\tn77\t0\t0\t1\t1\n")
    with pytest.raises(ValueError, match="n77"):
        load_tiny_imagenet(tmp_path, "val")


def make_folder(root: Path, rng: np.random.Generator) -> dict[str, list[np.ndarray]]:
    written = {"cat": [], "ant": [], "bee": []}
    for name, arrays in written.items():
        (root / name).mkdir(parents=True)
        for i in range(2):
            pixels = rng.integers(0, 256, (5, 5, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"img{i}.{'PNG' if i else 'png'}")
            arrays.append(pixels)
    (root / "ant" / "notes.txt").write_text("not an image")
    return written


def test_image_folder_sorts_classes_and_files_and_keeps_png_pixels(tmp_path):
    written = make_folder(tmp_path, np.random.default_rng(0))
    data = load_image_folder(tmp_path)
    assert data.class_names == ["ant", "bee", "cat"]
    np.testing.assert_array_equal(data.labels, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(data.ids, np.arange(6))
    expected = np.stack([written[c][i] for c in ("ant", "bee", "cat") for i in range(2)])
    np.testing.assert_array_equal(data.images, expected)


def test_image_folder_mixed_sizes_need_image_size(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    solid((10, 20, 30), size=6).save(tmp_path / "a" / "x.jpg", quality=100)
    Image.new("L", (9, 4), 77).save(tmp_path / "b" / "y.bmp")  # grayscale, non-square
    with pytest.raises(ValueError, match="image_size"):
        load_image_folder(tmp_path)
    data = load_source("image_folder", root=tmp_path, image_size=7)
    assert data.images.shape == (2, 7, 7, 3)
    assert np.all(data.images[1] == 77)  # grey replicated to RGB, constant under resizing
    assert np.abs(data.images[0].reshape(-1, 3).astype(int) - (10, 20, 30)).max() <= 3


def test_empty_folder_is_an_error(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(ValueError, match="no images"):
        load_image_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match="root"):
        load_image_folder(tmp_path / "missing")
