"""The update-cost benchmark's building blocks on tiny sizes: a timed compatible update, the
embedding rate of its generation, index builds on generated embeddings, and the cost table's
arithmetic. No Ray here (the Ray embedding path is reembed.run_ray, tested in test_reembed.py) and
no timing assertions."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import update_cost
from orchestrator.geometry import lorentz
from orchestrator.geometry.spaces import Space


@pytest.fixture(scope="module")
def bench():
    """The benchmark's module (benchmarks/update_cost.py runs its ``main``)."""
    return update_cost


@pytest.fixture(scope="module")
def update(bench, tmp_path_factory):
    return bench.train_update(tmp_path_factory.mktemp("update_cost"), epochs=1, parent_epochs=1, limit=160)


def test_the_update_is_trained_against_a_parent_and_saved(update):
    assert update.seconds > 0 and len(update.epochs) == 1
    assert update.epochs[0]["samples"] == 128  # 160 items, batch 64, last incomplete batch dropped
    assert update.space is Space.LORENTZ and update.width == 33  # hbct, embed_dim 32: d+1 columns
    assert (Path(update.checkpoint_uri) / "card.json").is_file() and len(update.sha256) == 64
    json.dumps(update.summary())


def test_embedding_rate_is_measured_with_the_updates_checkpoint(bench, update):
    timing = bench.measure_embedding(update, items=200, path="plain", batch_size=64)
    assert timing["images"] == 200 and timing["batches"] == 4
    assert timing["steady_images_per_s"] > 0 and timing["path"] == "plain" and timing["concurrency"] is None


@pytest.mark.parametrize("space, width", [(Space.LORENTZ, 9), (Space.COSINE, 8), (Space.POINCARE, 8)])
def test_generated_embeddings_lie_in_the_space(bench, space, width):
    x = bench.generated_embeddings(500, width, space, curv=1.0)
    assert x.shape == (500, width) and x.dtype == np.float32
    if space is Space.LORENTZ:  # on the hyperboloid: <x, x>_L = -1/K
        np.testing.assert_allclose(lorentz.inner(torch.from_numpy(x), torch.from_numpy(x)).numpy(), -1.0, atol=1e-5)
    if space is Space.POINCARE:
        assert (np.linalg.norm(x, axis=1) < 1.0).all()


@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_index_built_at_a_size_holds_that_many_items(bench, kind):
    for n in (400, 1000):
        run = bench.measure_index(n, 33, Space.LORENTZ, 1.0, kind)
        assert run["ntotal"] == n and run["n"] == n and run["width"] == 33 and run["seconds"] >= 0


def test_cost_rows_and_break_even_arithmetic(bench):
    index_seconds = {100_000: 0.5, 10_000: 0.05, 1_000_000: 5.0}
    rows = bench.cost_rows(train_seconds=20.0, images_per_s=4000.0, measured_items=20_000, index_seconds=index_seconds)
    assert [row["n"] for row in rows] == [10_000, 100_000, 1_000_000]
    assert [row["embed_extrapolated"] for row in rows] == [False, True, True]
    for row in rows:
        assert row["embed_s"] == pytest.approx(row["n"] / 4000.0)
        assert row["full_backfill_s"] == pytest.approx(row["embed_s"] + index_seconds[row["n"]])
        assert row["ratio"] == pytest.approx(row["full_backfill_s"] / 20.0)
    assert rows[2]["full_backfill_s"] == pytest.approx(255.0)
    # per item: 1/4000 s to embed + 5e-6 s to index -> 20 s buys 20 / 2.55e-4 items
    n_star = bench.break_even(20.0, 4000.0, index_seconds)
    assert n_star == pytest.approx(20.0 / (1 / 4000 + 5e-6))
    at_break_even = bench.cost_rows(20.0, 4000.0, 20_000, {round(n_star): 5e-6 * round(n_star)})[0]
    assert at_break_even["ratio"] == pytest.approx(1.0, rel=1e-4)
    table = bench.format_table({33: rows}, {33: n_star})
    assert "25.0*" in table and "break-even (d=33)" in table and f"{n_star:,.0f}" in table


def test_main_without_ray_writes_the_table_and_json(bench, tmp_path, capsys):
    out = tmp_path / "update_cost.json"
    assert bench.main(["--sizes", "300,1e3", "--epochs", "1", "--parent-epochs", "1", "--limit", "130",
                       "--embed-items", "500", "--embed-path", "plain", "--batch-size", "64",
                       "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["config"]["sizes"] == [300, 1000]
    assert sorted(document["rows"]) == ["128", "33"]
    for width in ("33", "128"):
        rows = document["rows"][width]
        assert [row["n"] for row in rows] == [300, 1000]
        assert [row["embed_extrapolated"] for row in rows] == [False, True]
        assert all(row["ratio"] == pytest.approx(row["full_backfill_s"] / document["train"]["seconds"]) for row in rows)
    assert {(run["n"], run["width"], run["ntotal"]) for run in document["index"]} == {
        (300, 33, 300), (1000, 33, 1000), (300, 128, 300), (1000, 128, 1000)}
    assert document["ray_init_seconds"] is None
    assert "break-even (d=128)" in capsys.readouterr().out
