"""LabeledImages validation/subsets and ImageTensorDataset pixels, resize and augmentation."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from orchestrator.data import ImageTensorDataset, LabeledImages, channel_statistics


def make_images(n: int = 6, size: int = 4, seed: int = 0) -> LabeledImages:
    rng = np.random.default_rng(seed)
    return LabeledImages(
        images=rng.integers(0, 256, size=(n, size, size, 3), dtype=np.uint8),
        labels=np.arange(n, dtype=np.int64) % 3,
        ids=np.arange(100, 100 + n, dtype=np.int64),
        class_names=["a", "b", "c"],
    )


def test_valid_set_reports_length_classes_and_shape():
    data = make_images()
    assert len(data) == 6 and data.num_classes == 3 and data.image_shape == (4, 4)


@pytest.mark.parametrize(
    ("field", "changes"),
    [
        ("images", {"images": np.zeros((2, 4, 4, 3), dtype=np.float32)}),
        ("images", {"images": np.zeros((2, 4, 4), dtype=np.uint8)}),
        ("labels", {"labels": np.zeros(2, dtype=np.int32)}),
        ("labels", {"labels": np.zeros(3, dtype=np.int64)}),
        ("labels", {"labels": np.array([0, 5], dtype=np.int64)}),
        ("ids", {"ids": np.array([7, 7], dtype=np.int64)}),
        ("ids", {"ids": [0, 1]}),
        ("class_names", {"class_names": ("a", "b")}),
    ],
)
def test_invalid_fields_raise_naming_the_field(field, changes):
    fields = dict(
        images=np.zeros((2, 4, 4, 3), dtype=np.uint8),
        labels=np.zeros(2, dtype=np.int64),
        ids=np.arange(2, dtype=np.int64),
        class_names=["a", "b"],
    )
    fields.update(changes)
    with pytest.raises(ValueError, match=field):
        LabeledImages(**fields)


def test_subset_by_positions_and_by_mask_keeps_rows_together():
    data = make_images()
    picked = data.subset([4, 1])
    np.testing.assert_array_equal(picked.images, data.images[[4, 1]])
    np.testing.assert_array_equal(picked.labels, [1, 1])
    np.testing.assert_array_equal(picked.ids, [104, 101])
    assert picked.class_names == data.class_names
    masked = data.subset(data.labels == 2)
    np.testing.assert_array_equal(masked.ids, [102, 105])
    assert len(data.subset([])) == 0


def test_subset_rejects_bad_indices():
    data = make_images()
    with pytest.raises(ValueError, match="indices"):
        data.subset([0, 6])
    with pytest.raises(ValueError, match="indices"):
        data.subset(np.array([True, False]))
    with pytest.raises(ValueError, match="ids"):  # repeating an item would repeat its id
        data.subset([1, 1])


def test_channel_statistics_match_float64_reference():
    data = make_images(n=5, size=3)
    mean, std = channel_statistics(data)
    for c in range(3):
        values = [data.images[i, y, x, c] / 255.0 for i in range(5) for y in range(3) for x in range(3)]
        assert mean[c] == pytest.approx(sum(values) / len(values), abs=1e-12)
        reference_std = (sum((v - mean[c]) ** 2 for v in values) / len(values)) ** 0.5
        assert std[c] == pytest.approx(reference_std, abs=1e-12)


def test_items_are_normalised_chw_with_int64_label_and_id():
    data = make_images()
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 2.0)
    image, label, item_id = ImageTensorDataset(data, image_size=4, mean=mean, std=std)[2]
    assert image.dtype == torch.float32 and image.shape == (3, 4, 4)
    assert label.dtype == torch.int64 and int(label) == 2
    assert item_id.dtype == torch.int64 and int(item_id) == 102
    expected = (data.images[2].astype(np.float64) / 255.0 - np.array(mean)) / np.array(std)
    np.testing.assert_allclose(image.numpy(), expected.transpose(2, 0, 1), atol=1e-6)


def test_upscaling_is_half_pixel_bilinear():
    # 1-D bilinear with align_corners=False, 2 -> 4: [a, 3a/4 + b/4, a/4 + 3b/4, b] along each axis.
    pixels = np.array([[0, 80], [160, 240]], dtype=np.uint8)
    data = LabeledImages(
        images=np.repeat(pixels[None, :, :, None], 3, axis=-1),
        labels=np.zeros(1, dtype=np.int64),
        ids=np.zeros(1, dtype=np.int64),
        class_names=["x"],
    )
    image = ImageTensorDataset(data, image_size=4, mean=(0, 0, 0), std=(1, 1, 1))[0][0].numpy() * 255
    weights = np.array([[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]])
    expected = weights @ pixels.astype(np.float64) @ weights.T
    for channel in image:
        np.testing.assert_allclose(channel, expected, atol=1e-4)


def test_downscaling_keeps_a_constant_image_constant():
    data = LabeledImages(
        images=np.full((1, 9, 9, 3), 51, dtype=np.uint8),
        labels=np.zeros(1, dtype=np.int64),
        ids=np.zeros(1, dtype=np.int64),
        class_names=["x"],
    )
    image = ImageTensorDataset(data, image_size=4, mean=(0, 0, 0), std=(1, 1, 1))[0][0]
    np.testing.assert_allclose(image.numpy(), np.full((3, 4, 4), 0.2), atol=1e-6)


def test_augmentation_is_a_padded_crop_possibly_flipped():
    data = make_images(n=1, size=8, seed=3)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.3, 0.4)
    dataset = ImageTensorDataset(data, image_size=8, mean=mean, std=std, augment=True, crop_padding=2)
    padded = np.pad(data.images[0].astype(np.float64) / 255.0, ((2, 2), (2, 2), (0, 0)))
    candidates = {}
    for top in range(5):
        for left in range(5):
            crop = padded[top : top + 8, left : left + 8]
            for flip in (False, True):
                view = crop[:, ::-1] if flip else crop
                candidates[(top, left, flip)] = ((view - mean) / std).transpose(2, 0, 1)
    torch.manual_seed(0)
    seen = []
    for _ in range(300):
        image = dataset[0][0].numpy()
        matches = [key for key, ref in candidates.items() if np.allclose(image, ref, atol=1e-5)]
        assert matches, "augmented image is not any padded crop / flip of the input"
        seen.append(matches[0])
    flips = sum(key[2] for key in seen) / len(seen)
    assert 0.4 < flips < 0.6
    assert len({key[:2] for key in seen}) == 25  # every offset of the 5 x 5 grid occurs


def test_default_crop_padding_scales_with_size():
    data = make_images(size=32)
    assert ImageTensorDataset(data, 32, (0, 0, 0), (1, 1, 1), augment=True).crop_padding == 4
    assert ImageTensorDataset(data, 64, (0, 0, 0), (1, 1, 1), augment=True).crop_padding == 8


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("image_size", dict(image_size=0, mean=(0, 0, 0), std=(1, 1, 1))),
        ("mean", dict(image_size=4, mean=(0, 0), std=(1, 1, 1))),
        ("std", dict(image_size=4, mean=(0, 0, 0), std=(1, 0, 1))),
        ("crop_padding", dict(image_size=4, mean=(0, 0, 0), std=(1, 1, 1), crop_padding=-1)),
    ],
)
def test_dataset_rejects_bad_arguments(name, kwargs):
    with pytest.raises(ValueError, match=name):
        ImageTensorDataset(make_images(), **kwargs)


def test_dataloader_collates_batches():
    data = make_images(n=6, size=8)
    loader = DataLoader(ImageTensorDataset(data, 16, (0.5,) * 3, (0.5,) * 3, augment=True), batch_size=4)
    images, labels, ids = next(iter(loader))
    assert images.shape == (4, 3, 16, 16) and images.dtype == torch.float32
    assert labels.tolist() == [0, 1, 2, 0] and ids.tolist() == [100, 101, 102, 103]
    assert float(images.min()) >= -1.0 - 1e-6 and float(images.max()) <= 1.0 + 1e-6


@pytest.mark.parametrize("size", [8, 16])  # stored size, then a resize to 16
@pytest.mark.parametrize("augment", [False, True])
def test_a_batch_fetch_yields_what_item_by_item_fetches_yield(size, augment):
    """A DataLoader asks ``__getitems__`` for a whole batch: the same tensors as ``__getitem__``
    item by item (with augmentation: the same crops and flips from the same generator state)."""
    data = make_images(n=7, size=size, seed=3)
    dataset = ImageTensorDataset(data, 16, (0.4, 0.5, 0.6), (0.2, 0.3, 0.4), augment=augment)
    indices = [5, 0, 3, 3, 6]
    torch.manual_seed(11)
    batch = dataset.__getitems__(indices)
    torch.manual_seed(11)
    one_by_one = [dataset[i] for i in indices]
    assert len(batch) == len(indices)
    for got, expected in zip(batch, one_by_one):
        assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, expected))


def test_a_dataloader_batch_is_the_stack_of_the_items():
    data = make_images(n=7, size=8, seed=3)
    dataset = ImageTensorDataset(data, 16, (0.4, 0.5, 0.6), (0.2, 0.3, 0.4))
    indices = [5, 0, 3, 3, 6]
    images, labels, ids = next(iter(DataLoader(dataset, batch_size=5, sampler=indices)))
    assert torch.equal(images, torch.stack([dataset[i][0] for i in indices]))
    assert labels.tolist() == data.labels[indices].tolist() and ids.tolist() == data.ids[indices].tolist()
