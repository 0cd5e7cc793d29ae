"""Loaders that turn a dataset on disk (or behind an fsspec URL) into a `LabeledImages`.

- `load_digits`: scikit-learn's bundled handwritten digits -- the embedded default, no network.
- `load_cifar`: CIFAR-10 / CIFAR-100 in the official *binary* format (never the pickle version:
  nothing is unpickled from storage). Local path or fsspec URL (`s3://`, `file://`, ...).
- `load_tiny_imagenet`: the standard tiny-imagenet-200 folder layout (local).
- `load_image_folder`: root/<class>/<images> (local).
- `load_parquet`: encoded image bytes or raw pixel arrays in a Parquet file, local or fsspec URL.
- `load_shapes`: procedurally rendered shapes x fill patterns, generated offline from a seed, the
  test split on held-out background styles (`orchestrator.data.procedural`).

The same loaders by name, for configuration files: `orchestrator.data.registry`.

Ids: every loader gives each item an id that is stable across calls and unique across the splits of
one dataset (digits: the index in the bundled array; CIFAR and Tiny-ImageNet: the position in the
official train-then-test order; folders and Parquet: the position in the sorted listing / row order,
or an id column).
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import tarfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.data.images import LabeledImages
from orchestrator.data.scenarios import stratified_sample

if TYPE_CHECKING:
    import pyarrow as pa

# fsspec, pyarrow and PIL are imported where a loader uses them: checking a pipeline file reads the
# loaders' signatures (orchestrator.data.registry) and pays for none of them.

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


# --------------------------------------------------------------------------- digits (embedded)

#: Where scikit-learn keeps the digits inside its package (its ``load_digits`` reads this file).
DIGITS_FILE = ("datasets", "data", "digits.csv.gz")


@functools.lru_cache(maxsize=1)
def bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``(images (1797, 8, 8) float64, targets (1797,) int64)``.

    Read from the CSV scikit-learn ships (8x8 values, then the class, per line), found without
    importing scikit-learn: importing it (and SciPy, which it imports) costs about a second of CPU
    in every process that loads the digits (the driver, each Ray Train worker, each tuning trial),
    and ``sklearn.datasets.load_digits`` does nothing more than this read
    (tests/data/test_data_digits.py compares the two). The arrays are read-only (one copy per
    process)."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the digits come with scikit-learn, which is not installed (pip install scikit-learn)")
    path = Path(next(iter(spec.submodule_search_locations)), *DIGITS_FILE)
    if not path.is_file():
        raise RuntimeError(f"{path}: scikit-learn's digits file is not where scikit-learn keeps it")
    with gzip.open(path, mode="rt", encoding="utf-8") as rows:
        data = np.loadtxt(rows, delimiter=",")
    images, targets = data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
    images.flags.writeable = targets.flags.writeable = False
    return images, targets


def load_digits(
    split: str = "train", image_size: int = 32, test_fraction: float = 0.3, seed: int = 0
) -> LabeledImages:
    """scikit-learn's bundled digits: 1,797 images of 8x8, values 0..16, classes "0".."9".

    Pixels are scaled to 0..255, upscaled to image_size x image_size (bilinear, antialiased), rounded
    to uint8 once, and replicated to 3 channels. `split` "train" / "test" is a class-stratified split
    (`stratified_sample`, test = round(test_fraction * 1797) items, deterministic in `seed`); "all"
    returns every item. ids are the indices in the bundled array, so train and test ids are disjoint.
    """
    import torch  # here, not at the top: gallery readers on Ray workers import this module without torch
    import torch.nn.functional as F

    if split not in ("train", "test", "all"):
        raise ValueError(f"split: expected 'train', 'test' or 'all', got {split!r}")
    if not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size: expected a positive int, got {image_size!r}")
    images, labels = bundled_digits()
    ids = np.arange(labels.size, dtype=np.int64)
    if split != "all":
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction: expected a value in (0, 1), got {test_fraction!r}")
        test = stratified_sample(labels, test_fraction, seed)
        ids = test if split == "test" else np.setdiff1d(ids, test)
    pixels = torch.from_numpy(images[ids] * (255.0 / 16.0)).unsqueeze(1)  # (N, 1, 8, 8) float64
    if image_size != pixels.shape[-1]:
        pixels = F.interpolate(
            pixels, size=(image_size, image_size), mode="bilinear", align_corners=False, antialias=True
        )
    gray = pixels.round().clamp(0, 255).to(torch.uint8).squeeze(1).numpy()  # (N, S, S)
    return LabeledImages(
        images=np.repeat(gray[..., None], 3, axis=-1),
        labels=labels[ids],
        ids=ids,
        class_names=[str(name) for name in range(10)],
    )


# --------------------------------------------------------------------------- CIFAR (binary format)

_CIFAR = {
    "cifar10": {
        "folder": "cifar-10-batches-bin",
        "url": "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
        "md5": "c32a1d4ab5d03f1284b67883e8d87530",  # the publisher's MD5 (cs.toronto.edu/~kriz/cifar.html)
        "train": [f"data_batch_{i}.bin" for i in range(1, 6)],
        "test": ["test_batch.bin"],
        "label_bytes": 1,
        "names": {"fine": ("batches.meta.txt", 10)},
    },
    "cifar100": {
        "folder": "cifar-100-binary",
        "url": "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",
        "md5": "03b5dce01913d631647c71ecec9e9cb8",
        "train": ["train.bin"],
        "test": ["test.bin"],
        "label_bytes": 2,
        "names": {"coarse": ("coarse_label_names.txt", 20), "fine": ("fine_label_names.txt", 100)},
    },
}
_CIFAR_PIXELS = 3 * 32 * 32
_CIFAR_TRAIN_SIZE = 50_000  # official train-set size of both variants: test ids start here


def load_cifar(
    root_or_url: str | os.PathLike,
    variant: str = "cifar100",
    split: str = "train",
    label: str = "fine",
    download: bool = False,
) -> LabeledImages:
    """CIFAR-10 / CIFAR-100 from the official binary files.

    Record layout: CIFAR-10 = 1 label byte + 3072 pixel bytes; CIFAR-100 = coarse byte + fine byte +
    3072 pixel bytes. Pixels are channel-major (1024 R, 1024 G, 1024 B), each plane row-major 32x32;
    they are returned as (N, 32, 32, 3). `root_or_url` is the extracted folder
    (cifar-10-batches-bin / cifar-100-binary) or its parent, as a local path or an fsspec URL.
    `label` picks CIFAR-100's "fine" (100) or "coarse" (20) labels. Class names come from
    batches.meta.txt / fine_label_names.txt / coarse_label_names.txt when present, else "0", "1", ...
    ids: train record i -> i, test record i -> 50,000 + i (the official train-then-test order).
    `download=True` fetches the official archive into a local `root_or_url` first if files are missing.
    """
    spec = _cifar_spec(variant)
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    if label not in spec["names"]:
        raise ValueError(f"label: expected one of {sorted(spec['names'])} for {variant}, got {label!r}")
    if download and not _find_cifar_folder(str(root_or_url), spec):
        download_cifar(variant, root_or_url)
    found = _find_cifar_folder(str(root_or_url), spec)
    if found is None:
        raise FileNotFoundError(
            f"root_or_url: no {variant} binary files under {root_or_url!s} (looked in it and in "
            f"{spec['folder']}/ for {', '.join(spec['train'] + spec['test'])}). Extract {spec['url']} there, "
            f"or call download_cifar({variant!r}, dest) / pass download=True."
        )
    fs, folder = found
    record = spec["label_bytes"] + _CIFAR_PIXELS
    chunks = []
    for name in spec[split]:
        with fs.open(f"{folder}/{name}", "rb") as handle:
            raw = np.frombuffer(handle.read(), dtype=np.uint8)
        if raw.size % record:
            raise ValueError(
                f"{folder}/{name}: size {raw.size} bytes is not a multiple of the {record}-byte {variant} record"
            )
        chunks.append(raw.reshape(-1, record))
    records = np.concatenate(chunks)
    label_byte = 0 if label == "coarse" or spec["label_bytes"] == 1 else 1
    labels = records[:, label_byte].astype(np.int64)
    images = records[:, spec["label_bytes"] :].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    file_name, count = spec["names"][label]
    class_names = _read_names(fs, f"{folder}/{file_name}") or [str(i) for i in range(count)]
    offset = 0 if split == "train" else _CIFAR_TRAIN_SIZE
    return LabeledImages(
        images=np.ascontiguousarray(images),
        labels=labels,
        ids=np.arange(offset, offset + labels.size, dtype=np.int64),
        class_names=class_names,
    )


def download_cifar(variant: str, dest: str | os.PathLike, timeout: float = 60.0) -> Path:
    """Fetch the official CIFAR binary archive into local `dest` and extract it; returns the folder.

    Skips the download when the extracted folder is already complete. The archive (downloaded, or
    placed by hand) must have the publisher's MD5, else ValueError and it is removed. Offline,
    raises RuntimeError explaining where to place the files by hand.
    """
    spec = _cifar_spec(variant)
    if "://" in str(dest):
        raise ValueError(f"dest: download_cifar writes to a local folder, got the URL {dest!s}")
    dest = Path(dest)
    folder = dest / spec["folder"]
    if all((folder / name).is_file() for name in spec["train"] + spec["test"]):
        return folder
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / spec["url"].rsplit("/", 1)[1]
    if not archive.is_file():
        partial = archive.with_name(archive.name + ".part")
        try:
            with urllib.request.urlopen(spec["url"], timeout=timeout) as response, open(partial, "wb") as out:
                while block := response.read(1 << 20):
                    out.write(block)
        except (urllib.error.URLError, OSError) as err:
            partial.unlink(missing_ok=True)
            raise RuntimeError(
                f"could not download {variant} from {spec['url']} ({err}). Without network access, fetch "
                f"that archive elsewhere and either place it at {archive} or extract it so that "
                f"{folder}/ holds {', '.join(spec['train'] + spec['test'])}."
            ) from err
        partial.replace(archive)
    check_md5(archive, spec["md5"])
    safe_extract_tar(archive, dest)
    return folder


def check_md5(path: Path, expected: str) -> None:
    """ValueError naming ``path`` (which is removed, so a retry downloads it again) when its MD5 is
    not ``expected``."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    if digest.hexdigest() != expected:
        path.unlink()
        raise ValueError(f"{path}: MD5 {digest.hexdigest()} is not the publisher's {expected}; the file was "
                         "removed (a truncated or altered download); fetch it again")


def safe_extract_tar(archive: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Extract a tar archive into `dest`, refusing any member that could write outside it.

    Rejected (ValueError naming the member): absolute paths, '..' components, links, devices/FIFOs.
    """
    dest = Path(dest)
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            name = member.name
            if name.startswith(("/", "\\")) or ".." in Path(name.replace("\\", "/")).parts:
                raise ValueError(f"archive {archive}: member {name!r} would be written outside {dest}")
            if not (member.isfile() or member.isdir()):
                raise ValueError(f"archive {archive}: member {name!r} is a link or special file; refusing to extract")
        extract_options = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **extract_options)


def _cifar_spec(variant: str) -> dict[str, Any]:
    if variant not in _CIFAR:
        raise ValueError(f"variant: expected one of {sorted(_CIFAR)}, got {variant!r}")
    return _CIFAR[variant]


def _find_cifar_folder(root: str, spec: dict[str, Any]) -> tuple[Any, str] | None:
    """(filesystem, folder path) of the folder holding the binary files: root itself or root/<folder>."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(root)
    path = path.rstrip("/")
    for folder in (f"{path}/{spec['folder']}", path):
        if all(fs.exists(f"{folder}/{name}") for name in spec["train"] + spec["test"]):
            return fs, folder
    return None


def _read_names(fs: Any, path: str) -> list[str] | None:
    if not fs.exists(path):
        return None
    with fs.open(path, "rb") as handle:
        lines = handle.read().decode("utf-8").splitlines()
    return [line.strip() for line in lines if line.strip()]


# --------------------------------------------------------------------------- folder layouts

_TINY_IMAGENET_TRAIN_SIZE = 100_000  # official train-set size: val ids start here


def load_tiny_imagenet(
    root: str | os.PathLike, split: str = "train", image_size: int | None = None
) -> LabeledImages:
    """Tiny-ImageNet (tiny-imagenet-200 layout) read with PIL.

    train: root/train/<wnid>/images/*.JPEG; val: root/val/images/*.JPEG labelled by
    root/val/val_annotations.txt (file<TAB>wnid<TAB>box). The labelled val split is the test split
    (hbct.md §10, §15.17). Classes = the wnids of wnids.txt in sorted order (Decision: sorted, the
    order torchvision's ImageFolder uses, so "first 50% of classes" is reproducible); class names are
    the first synonym in words.txt when present, else the wnid. ids: train items in sorted
    (wnid, file) order -> 0.., val items in annotation-file order -> 100,000 + i.
    """
    if split not in ("train", "val"):
        raise ValueError(f"split: expected 'train' or 'val', got {split!r}")
    root = Path(root)
    wnids_file = root / "wnids.txt"
    if not wnids_file.is_file():
        raise FileNotFoundError(f"root: {wnids_file} not found; expected the tiny-imagenet-200 folder")
    wnids = sorted({line.strip() for line in wnids_file.read_text().splitlines() if line.strip()})
    index = {wnid: i for i, wnid in enumerate(wnids)}
    if split == "train":
        files, labels = [], []
        for wnid in wnids:
            folder = root / "train" / wnid / "images"
            found = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
            files += found
            labels += [index[wnid]] * len(found)
        offset = 0
    else:
        files, labels = [], []
        for line in (root / "val" / "val_annotations.txt").read_text().splitlines():
            if not line.strip():
                continue
            file_name, wnid = line.split("\t")[:2]
            if wnid not in index:
                raise ValueError(f"val_annotations.txt: wnid {wnid!r} of {file_name} is not in wnids.txt")
            files.append(root / "val" / "images" / file_name)
            labels.append(index[wnid])
        offset = _TINY_IMAGENET_TRAIN_SIZE
    return LabeledImages(
        images=_read_images(files, image_size),
        labels=np.asarray(labels, dtype=np.int64),
        ids=np.arange(offset, offset + len(files), dtype=np.int64),
        class_names=_tiny_imagenet_names(root / "words.txt", wnids),
    )


def load_image_folder(root: str | os.PathLike, image_size: int | None = None) -> LabeledImages:
    """root/<class_name>/<image files> (png, jpg, jpeg, bmp, webp; case-insensitive).

    Classes are the sub-folders sorted by name; files are sorted by name within a class; ids are the
    positions in that order. Images are converted to RGB; `image_size` resizes every image to
    image_size x image_size (bilinear), and is required when the images differ in size.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"root: {root} is not a directory")
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir())
    files, labels = [], []
    for label, class_dir in enumerate(class_dirs):
        found = sorted(p for p in class_dir.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        files += found
        labels += [label] * len(found)
    if not files:
        raise ValueError(f"root: no images with extensions {IMAGE_EXTENSIONS} under {root}/<class>/")
    return LabeledImages(
        images=_read_images(files, image_size),
        labels=np.asarray(labels, dtype=np.int64),
        ids=np.arange(len(files), dtype=np.int64),
        class_names=[p.name for p in class_dirs],
    )


def _tiny_imagenet_names(words_file: Path, wnids: list[str]) -> list[str]:
    if not words_file.is_file():
        return list(wnids)
    words = {}
    for line in words_file.read_text().splitlines():
        wnid, _, text = line.partition("\t")
        words[wnid.strip()] = text.split(",")[0].strip()
    return [words.get(wnid) or wnid for wnid in wnids]


def _read_images(files: Sequence[Path], image_size: int | None) -> np.ndarray:
    """Stack image files as uint8 (N, H, W, 3)."""
    _check_image_size(image_size)
    return _stack([_decode(path.read_bytes(), image_size, str(path)) for path in files], image_size)


def _decode(data: bytes, image_size: int | None, where: str) -> np.ndarray:
    """Encoded image bytes -> uint8 (H, W, 3), resized to image_size x image_size when given."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            rgb = image.convert("RGB")
    except (OSError, Image.DecompressionBombError) as err:
        raise ValueError(f"{where}: cannot decode image ({err})") from err
    if image_size is not None and rgb.size != (image_size, image_size):
        rgb = rgb.resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8)


def _check_image_size(image_size: int | None) -> None:
    if image_size is not None and (not isinstance(image_size, int) or image_size < 1):
        raise ValueError(f"image_size: expected a positive int or None, got {image_size!r}")


def _stack(images: Sequence[np.ndarray], image_size: int | None) -> np.ndarray:
    if not images:
        return np.zeros((0, image_size or 0, image_size or 0, 3), dtype=np.uint8)
    shapes = sorted({im.shape for im in images})
    if len(shapes) > 1:
        raise ValueError(f"image_size: images differ in size ({shapes[:4]}...); pass image_size to resize them")
    return np.stack(images)


# --------------------------------------------------------------------------- Parquet


def load_parquet(
    path_or_url: str | os.PathLike,
    image_column: str = "image",
    label_column: str = "label",
    id_column: str | None = None,
    image_shape: Sequence[int] | None = None,
    image_size: int | None = None,
    class_names: Sequence[str] | None = None,
) -> LabeledImages:
    """A Parquet file (local path or fsspec URL) with one image and one label per row.

    Image column, one of:
    - encoded bytes (PNG, JPEG, ...), or a struct with a "bytes" field (HuggingFace `Image` feature);
      decoded with PIL to RGB, resized to image_size x image_size when `image_size` is given;
    - a flat list of integers 0..255 of length H*W*C, reshaped with `image_shape` = (H, W) or (H, W, C);
    - nested lists of shape (H, W, 3) or (H, W).
    Single-channel images are replicated to 3 channels.
    Labels: integers >= 0, or strings (mapped to the sorted unique strings). Class names: the
    `class_names` argument, else the HuggingFace ClassLabel names in the schema metadata, else the
    sorted strings, else "0".."max". ids: `id_column` (unique integers) or the row index.
    """
    import fsspec
    import pyarrow.parquet as pq

    _check_image_size(image_size)
    columns = [image_column, label_column] + ([id_column] if id_column else [])
    with fsspec.open(str(path_or_url), "rb") as handle:
        parquet = pq.ParquetFile(handle)
        schema = parquet.schema_arrow
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise ValueError(f"{path_or_url}: column(s) {missing} not found; columns are {schema.names}")
        table = parquet.read(columns=columns)
    images = _parquet_images(table.column(image_column).combine_chunks(), image_column, image_shape, image_size)
    labels, names_from_strings = _parquet_labels(table.column(label_column).combine_chunks(), label_column)
    if id_column:
        ids = _integer_column(table.column(id_column).combine_chunks(), id_column)
    else:
        ids = np.arange(len(table), dtype=np.int64)
    if class_names is not None:
        names = [str(n) for n in class_names]
    else:
        names = names_from_strings or _huggingface_names(schema, label_column) or []
        names = names or [str(i) for i in range(int(labels.max()) + 1 if labels.size else 0)]
    return LabeledImages(images=images, labels=labels, ids=ids, class_names=names)


def _parquet_images(
    column: pa.Array, name: str, image_shape: Sequence[int] | None, image_size: int | None
) -> np.ndarray:
    import pyarrow as pa

    if column.null_count:
        raise ValueError(f"{name}: {column.null_count} row(s) have no image")
    kind = column.type
    if pa.types.is_struct(kind):
        if kind.get_field_index("bytes") < 0:
            raise ValueError(f"{name}: struct column has no 'bytes' field (fields: {[f.name for f in kind]})")
        column, kind = column.field("bytes"), kind.field("bytes").type
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        decoded = [_decode(value, image_size, f"{name}[{row}]") for row, value in enumerate(column.to_pylist())]
        return _stack(decoded, image_size)
    if _is_list(kind):
        if image_size is not None:
            raise ValueError(f"image_size: resizing applies to encoded images only, column {name!r} holds arrays")
        return _array_images(column, name, image_shape)
    raise ValueError(f"{name}: unsupported image column type {kind}; expected bytes, struct<bytes>, or lists of uint8")


def _array_images(column: pa.Array, name: str, image_shape: Sequence[int] | None) -> np.ndarray:
    """List column -> uint8 (N, H, W, 3); every nesting level must have one length."""
    import pyarrow as pa

    rows, dims, values = len(column), [], column
    while _is_list(values.type):
        lengths = np.unique(values.value_lengths().to_numpy(zero_copy_only=False)) if len(values) else np.array([0])
        if lengths.size != 1:
            raise ValueError(f"{name}: image arrays differ in length ({lengths[:4].tolist()}...)")
        dims.append(int(lengths[0]))
        values = values.flatten()
    if not pa.types.is_integer(values.type):
        raise ValueError(f"{name}: pixel values must be integers 0..255, got {values.type}")
    pixels = values.to_numpy(zero_copy_only=False)
    if pixels.size and pixels.dtype != np.uint8 and (pixels.min() < 0 or pixels.max() > 255):  # uint8: in range
        raise ValueError(f"{name}: pixel values must lie in 0..255, got [{pixels.min()}, {pixels.max()}]")
    if len(dims) == 1:
        if image_shape is None:
            raise ValueError(
                f"image_shape: column {name!r} holds flat arrays of length {dims[0]}; pass (H, W) or (H, W, C)"
            )
        shape = tuple(int(s) for s in image_shape)
        if len(shape) not in (2, 3) or int(np.prod(shape)) != dims[0]:
            raise ValueError(f"image_shape: {tuple(image_shape)} does not match the array length {dims[0]}")
        dims = list(shape)
    elif image_shape is not None and tuple(image_shape) != tuple(dims):
        raise ValueError(f"image_shape: {tuple(image_shape)} does not match the nested array shape {tuple(dims)}")
    if len(dims) == 2:
        dims.append(1)
    if len(dims) != 3 or dims[2] not in (1, 3):
        raise ValueError(f"{name}: expected images of shape (H, W), (H, W, 1) or (H, W, 3), got {tuple(dims)}")
    images = pixels.astype(np.uint8).reshape(rows, *dims)
    return np.repeat(images, 3, axis=-1) if dims[2] == 1 else images


def _is_list(kind: pa.DataType) -> bool:
    import pyarrow as pa

    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _parquet_labels(column: pa.Array, name: str) -> tuple[np.ndarray, list[str] | None]:
    import pyarrow as pa

    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        if column.null_count:
            raise ValueError(f"{name}: {column.null_count} row(s) have no label")
        strings = np.asarray(column.to_pylist(), dtype=object)
        names, labels = np.unique(strings, return_inverse=True)
        return labels.astype(np.int64), [str(n) for n in names]
    labels = _integer_column(column, name, unique=False)
    if labels.size and labels.min() < 0:
        raise ValueError(f"{name}: labels must be >= 0, got {labels.min()}")
    return labels, None


def _integer_column(column: pa.Array, name: str, unique: bool = True) -> np.ndarray:
    import pyarrow as pa

    if not pa.types.is_integer(column.type) or column.null_count:
        raise ValueError(
            f"{name}: expected an integer column without nulls, got {column.type} with {column.null_count} null(s)"
        )
    values = column.to_numpy(zero_copy_only=False).astype(np.int64)
    if unique and np.unique(values).size != values.size:
        raise ValueError(f"{name}: ids must be unique")
    return values


def _huggingface_names(schema: pa.Schema, label_column: str) -> list[str] | None:
    """ClassLabel names that HuggingFace `datasets` stores in the Parquet schema metadata (JSON)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return None
    feature = json.loads(raw).get("info", {}).get("features", {}).get(label_column, {})
    names = feature.get("names") if isinstance(feature, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else None
