"""The re-embedding benchmark's building blocks on a tiny gallery: the plain loop and the Ray Data
path embed the same ids to the same vectors, and the result arithmetic (steady rate, medians,
ratios, table). No timing assertions: the numbers only mean something from a full run
(benchmarks/README.md)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import ray

from benchmarks import reembed
from local_ray import start_local_ray

ITEMS, BATCH = 300, 64  # the tiled gallery wraps the 1,797 digits only for > 1,797 items; 5 batches


@pytest.fixture(scope="module")
def bench():
    """The benchmark's module (benchmarks/reembed.py runs its ``main``)."""
    return reembed


@pytest.fixture(scope="module")
def local_ray():
    start_local_ray()
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def setup(bench, tmp_path_factory):
    return bench.make_setup(tmp_path_factory.mktemp("reembed"), items=ITEMS)


@pytest.fixture(scope="module")
def plain(bench, setup):
    return bench.run_plain(setup, BATCH)


def check_timing(timing: dict, images: int, batches: int) -> None:
    assert timing["images"] == images and timing["batches"] == batches
    for key in ("steady_images_per_s", "first_batch_s", "wall_s"):
        assert timing[key] > 0 and math.isfinite(timing[key]), key
    assert timing["wall_s"] >= timing["first_batch_s"]
    json.dumps(timing)


def test_tiled_digits_repeat_the_bundled_set_with_unique_ids(bench):
    gallery = bench.tiled_digits(2000)
    assert len(gallery) == 2000 and gallery.images.shape[1:] == (32, 32, 3)
    np.testing.assert_array_equal(gallery.ids, np.arange(2000))
    np.testing.assert_array_equal(gallery.images[1797], gallery.images[0])  # wraps after 1,797 digits
    assert gallery.labels[1797] == gallery.labels[0]


def test_plain_loop_embeds_every_item_in_batches(setup, plain):
    np.testing.assert_array_equal(plain.ids, setup.gallery.ids)
    assert plain.embeddings.shape == (ITEMS, 33) and plain.embeddings.dtype == np.float32  # Lorentz d+1
    assert np.isfinite(plain.embeddings).all()
    assert ((plain.uncertainty >= 0) & (plain.uncertainty <= 1)).all()  # hbct: a hyperbolic generation
    check_timing(plain.timing, ITEMS, math.ceil(ITEMS / BATCH))


@pytest.mark.e2e
@pytest.mark.parametrize("concurrency", [1, 2])
def test_ray_data_path_gives_the_plain_loops_embeddings(bench, local_ray, setup, plain, concurrency):
    embedded = bench.run_ray(setup, concurrency, BATCH)
    ordered = embedded.sorted_by_id()
    np.testing.assert_array_equal(ordered.ids, setup.gallery.ids)  # every item once
    np.testing.assert_allclose(ordered.embeddings, plain.embeddings, atol=1e-5, rtol=0)
    np.testing.assert_allclose(ordered.uncertainty, plain.uncertainty, atol=1e-5, rtol=0)
    assert bench.max_difference(plain, embedded) <= 1e-5
    assert embedded.timing["images"] == ITEMS and embedded.timing["batches"] >= 2
    assert embedded.timing["dataset_s"] >= 0
    assert bench.cluster_description()["cpus"] == 2


def test_max_difference_refuses_paths_with_other_ids(bench, plain):
    other = bench.Embedded(plain.ids[:-1], plain.embeddings[:-1], plain.uncertainty[:-1], plain.timing)
    with pytest.raises(ValueError, match="different ids"):
        bench.max_difference(plain, other)


def test_steady_rate_counts_the_images_after_the_first_batch(bench):
    clock = bench.BatchClock()
    clock.started, clock.stamps, clock.rows = 10.0, [12.0, 13.0, 14.0], [100, 100, 50]
    summary = clock.summary()
    assert summary == {"images": 250, "batches": 3, "steady_images_per_s": 75.0, "first_batch_s": 2.0,
                       "wall_s": 4.0}
    clock.stamps, clock.rows = [12.0], [100]
    with pytest.raises(ValueError, match="two output batches"):
        clock.summary()


def test_medians_ratios_and_table(bench):
    def run(rate, first):
        return {"images": 100, "batches": 4, "steady_images_per_s": rate, "first_batch_s": first, "wall_s": first + 1}

    results = {"plain": bench.median_runs([run(100.0, 0.1), run(300.0, 0.3), run(200.0, 0.2)]),
               "ray_c1": bench.median_runs([run(90.0, 5.0)]),
               "ray_c2": bench.median_runs([run(180.0, 6.0), run(160.0, 7.0)])}
    assert results["plain"]["steady_images_per_s"] == 200.0 and len(results["plain"]["runs"]) == 3
    assert results["ray_c2"]["steady_images_per_s"] == 170.0 and results["ray_c2"]["first_batch_s"] == 6.5
    assert bench.ratios(results) == pytest.approx({"ray_c1/plain": 0.45, "ray_c2/plain": 0.85})
    table = bench.format_table(results, ray_init_seconds=4.2)
    assert "ray_c1/plain: 0.450× (target ≥ 0.9×: NOT met)" in table
    assert "ray.init 4.20 s" in table
