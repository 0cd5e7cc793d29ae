"""Query files: images and embeddings read without pickle, errors naming the file."""
import numpy as np
import pytest
from PIL import Image

from orchestrator.search.queries import read_query_file


def test_npy_images_grey_or_rgb_and_float_embeddings(tmp_path):
    grey = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4)
    np.save(tmp_path / "grey.npy", grey)
    batch = read_query_file([tmp_path / "grey.npy"])
    assert batch.images.shape == (2, 4, 4, 3) and (batch.images[..., 2] == grey).all() and batch.embeddings is None
    np.save(tmp_path / "emb.npy", np.ones((3, 5), np.float32))
    assert read_query_file([str(tmp_path / "emb.npy")]).embeddings.shape == (3, 5)


def test_npz_carries_labels_and_ids_for_evaluation(tmp_path):
    np.savez(tmp_path / "q.npz", embeddings=np.zeros((2, 3)), labels=np.array([1, 2]), ids=np.array([10, 11]))
    batch = read_query_file([tmp_path / "q.npz"])
    assert batch.labels.tolist() == [1, 2] and batch.ids.tolist() == [10, 11] and len(batch) == 2
    np.savez(tmp_path / "bad.npz", embeddings=np.zeros((2, 3)), labels=np.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"bad.npz: 'labels' must be an integer array of shape \(2,\)"):
        read_query_file([tmp_path / "bad.npz"])


def test_image_files_are_stacked_and_must_share_a_size(tmp_path):
    for name, size in (("a.png", 6), ("b.png", 6), ("c.png", 7)):
        Image.fromarray(np.full((size, size, 3), 200, np.uint8)).save(tmp_path / name)
    batch = read_query_file([tmp_path / "a.png", tmp_path / "b.png"])
    assert batch.images.shape == (2, 6, 6, 3) and (batch.images == 200).all()
    with pytest.raises(ValueError, match="query images must share one size"):
        read_query_file([tmp_path / "a.png", tmp_path / "c.png"])


def test_a_folder_of_images_is_read_in_path_order_named_and_resized(tmp_path):
    rng = np.random.default_rng(0)
    written = {}
    for name, size in (("b/2.jpg", 9), ("a/1.png", 6), ("a/0.png", 6)):
        (tmp_path / "q" / name).parent.mkdir(parents=True, exist_ok=True)
        written[name] = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(written[name]).save(tmp_path / "q" / name, quality=100)
    (tmp_path / "q" / "notes.txt").write_text("not an image")
    batch = read_query_file([tmp_path / "q"], image_size=6)
    assert batch.names == tuple(str(tmp_path / "q" / n) for n in ("a/0.png", "a/1.png", "b/2.jpg"))
    assert batch.images.shape == (3, 6, 6, 3)
    np.testing.assert_array_equal(batch.images[0], written["a/0.png"])  # PNG at the size: unchanged
    resized = np.asarray(Image.open(tmp_path / "q" / "b/2.jpg").convert("RGB").resize((6, 6), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(batch.images[2], resized)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="query folder .*empty' holds no images"):
        read_query_file([tmp_path / "empty"])


@pytest.mark.parametrize("array, message", [
    (np.zeros((2, 3, 3, 4), np.uint8), r"shape \(N, H, W, 3\) or \(N, H, W\)"),
    (np.zeros((2, 3), np.int32), "expected uint8 images"),
    (np.array([[np.nan, 1.0]]), "NaN or infinite"),
])
def test_bad_arrays_name_the_file(tmp_path, array, message):
    np.save(tmp_path / "q.npy", array)
    with pytest.raises(ValueError, match=message) as raised:
        read_query_file([tmp_path / "q.npy"])
    assert "q.npy" in str(raised.value)


def test_object_arrays_are_refused_without_unpickling(tmp_path):
    np.save(tmp_path / "evil.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle"):
        read_query_file([tmp_path / "evil.npy"])


def test_missing_files_and_mixed_kinds_are_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_query_file([tmp_path / "nope.npy"])
    (tmp_path / "x.txt").write_text("1")
    with pytest.raises(ValueError, match="give one .npy/.npz file or image files"):
        read_query_file([tmp_path / "x.txt"])


def test_npz_embeddings_keyed_by_generation_give_every_generation_the_same_queries(tmp_path):
    new, old = np.ones((2, 4), np.float32), np.full((2, 3), 0.5, np.float32)
    np.savez(tmp_path / "q.npz", **{"embeddings@g1": new, "embeddings@g0": old}, ids=np.array([7, 8]))
    batch = read_query_file([tmp_path / "q.npz"])
    assert batch.embeddings is None and batch.images is None and len(batch) == 2 and batch.ids.tolist() == [7, 8]
    assert sorted(batch.embeddings_by_generation) == ["g0", "g1"]
    np.testing.assert_array_equal(batch.embeddings_by_generation["g0"], old)


@pytest.mark.parametrize("arrays, message", [
    ({"embeddings@g1": np.ones((2, 4)), "embeddings@g0": np.ones((3, 3))}, r"the same queries, got rows \{'g0': 3, 'g1': 2\}"),
    ({"embeddings@g1": np.ones((2, 4)), "embeddings": np.ones((2, 4))}, "or arrays 'embeddings@<generation>' only"),
    ({"embeddings@": np.ones((2, 4))}, "array 'embeddings@' names no generation"),
    ({"embeddings@g1": np.zeros((2, 4), np.uint8)}, "array 'embeddings@g1' must hold float embeddings"),
    ({"embeddings@g1": np.array([[np.inf, 1.0]])}, "array 'embeddings@g1': the query embeddings contain NaN"),
])
def test_bad_keyed_embeddings_name_the_file_and_array(tmp_path, arrays, message):
    np.savez(tmp_path / "q.npz", **arrays)
    with pytest.raises(ValueError, match=message) as raised:
        read_query_file([tmp_path / "q.npz"])
    assert "q.npz" in str(raised.value) and "\n" not in str(raised.value)
