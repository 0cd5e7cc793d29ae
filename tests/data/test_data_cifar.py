"""CIFAR-10/100 binary readers on small files written in the official record layout."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.data import load_cifar, load_source


def write_records(path: Path, label_bytes: np.ndarray, images: np.ndarray) -> None:
    """label_bytes (N, L) uint8, images (N, 32, 32, 3) uint8 -> records of L + 3072 bytes, planes R, G, B."""
    with open(path, "wb") as out:
        for labels, image in zip(label_bytes, images):
            out.write(bytes(labels.tolist()))
            for channel in range(3):
                out.write(image[:, :, channel].tobytes())  # row-major 32 x 32 plane


def make_cifar10(root: Path, per_batch: int = 3, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    train_images = rng.integers(0, 256, (5 * per_batch, 32, 32, 3), dtype=np.uint8)
    train_labels = rng.integers(0, 10, 5 * per_batch).astype(np.uint8)
    for b in range(5):
        part = slice(b * per_batch, (b + 1) * per_batch)
        write_records(folder / f"data_batch_{b + 1}.bin", train_labels[part, None], train_images[part])
    test_images = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    test_labels = np.array([9, 0, 3, 3], dtype=np.uint8)
    write_records(folder / "test_batch.bin", test_labels[:, None], test_images)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    (folder / "batches.meta.txt").write_text("\n".join(names) + "\n\n")
    return dict(folder=folder, train=(train_images, train_labels), test=(test_images, test_labels), names=names)


def make_cifar100(root: Path, with_names: bool = True) -> dict:
    rng = np.random.default_rng(1)
    folder = root / "cifar-100-binary"
    folder.mkdir(parents=True)
    data = {}
    for split, n in (("train", 5), ("test", 3)):
        images = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        coarse = rng.integers(0, 20, n).astype(np.uint8)
        fine = rng.integers(20, 100, n).astype(np.uint8)  # differs from every coarse value
        write_records(folder / f"{split}.bin", np.stack([coarse, fine], axis=1), images)
        data[split] = (images, coarse, fine)
    if with_names:
        (folder / "fine_label_names.txt").write_text("\n".join(f"fine{i}" for i in range(100)))
        (folder / "coarse_label_names.txt").write_text("\n".join(f"coarse{i}" for i in range(20)))
    return data


def test_cifar10_round_trips_pixels_labels_names_and_ids(tmp_path):
    made = make_cifar10(tmp_path)
    train = load_cifar(tmp_path, variant="cifar10", split="train")
    np.testing.assert_array_equal(train.images, made["train"][0])
    np.testing.assert_array_equal(train.labels, made["train"][1])
    np.testing.assert_array_equal(train.ids, np.arange(15))
    assert train.class_names == made["names"]
    test = load_cifar(made["folder"], variant="cifar10", split="test")  # the folder itself works too
    np.testing.assert_array_equal(test.images, made["test"][0])
    np.testing.assert_array_equal(test.labels, [9, 0, 3, 3])
    np.testing.assert_array_equal(test.ids, 50_000 + np.arange(4))


def test_channel_major_bytes_land_in_hwc_positions(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    record = np.zeros(3073, dtype=np.uint8)
    record[0] = 7  # label
    record[1 + 1] = 200  # R plane, row 0, column 1
    record[1 + 1024 + 32] = 150  # G plane, row 1, column 0
    record[1 + 2048 + 32 * 31 + 31] = 99  # B plane, row 31, column 31
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        (folder / name).write_bytes(record.tobytes())
    data = load_cifar(tmp_path, variant="cifar10", split="test")
    image = data.images[0]
    assert data.labels[0] == 7 and data.class_names == [str(i) for i in range(10)]
    assert image[0, 1, 0] == 200 and image[1, 0, 1] == 150 and image[31, 31, 2] == 99
    assert int(image.sum()) == 200 + 150 + 99


def test_cifar100_reads_both_label_bytes(tmp_path):
    made = make_cifar100(tmp_path)
    fine = load_cifar(tmp_path, variant="cifar100", split="train", label="fine")
    coarse = load_cifar(tmp_path, variant="cifar100", split="train", label="coarse")
    images, coarse_labels, fine_labels = made["train"]
    np.testing.assert_array_equal(fine.images, images)
    np.testing.assert_array_equal(fine.labels, fine_labels)
    np.testing.assert_array_equal(coarse.labels, coarse_labels)
    assert fine.class_names[42] == "fine42" and len(fine.class_names) == 100
    assert coarse.class_names[3] == "coarse3" and len(coarse.class_names) == 20


def test_cifar100_without_name_files_uses_numbers(tmp_path):
    make_cifar100(tmp_path, with_names=False)
    data = load_source("cifar100", root_or_url=tmp_path, split="test", label="coarse")
    assert data.class_names == [str(i) for i in range(20)]
    np.testing.assert_array_equal(data.ids, 50_000 + np.arange(3))


def test_file_url_goes_through_fsspec(tmp_path):
    made = make_cifar100(tmp_path)
    data = load_cifar(f"file://{tmp_path}", variant="cifar100", split="test")
    np.testing.assert_array_equal(data.images, made["test"][0])
    np.testing.assert_array_equal(data.labels, made["test"][2])


def test_truncated_file_and_missing_folder_raise_clear_errors(tmp_path):
    made = make_cifar10(tmp_path)
    with open(made["folder"] / "test_batch.bin", "ab") as out:
        out.write(b"\x00" * 10)
    with pytest.raises(ValueError, match="not a multiple of the 3073-byte"):
        load_cifar(tmp_path, variant="cifar10", split="test")
    with pytest.raises(FileNotFoundError, match="download_cifar"):
        load_cifar(tmp_path / "nowhere", variant="cifar100")


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("variant", dict(variant="cifar1000")),
        ("split", dict(variant="cifar10", split="val")),
        ("label", dict(variant="cifar10", label="coarse")),
    ],
)
def test_bad_arguments_are_named(tmp_path, name, kwargs):
    with pytest.raises(ValueError, match=name):
        load_cifar(tmp_path, **kwargs)


def test_unknown_source_lists_known_names():
    with pytest.raises(ValueError, match="digits, cifar10, cifar100, tiny_imagenet, image_folder, parquet"):
        load_source("mnist")
