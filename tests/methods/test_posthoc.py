"""Post-hoc maps (methods/posthoc.py, models/adapters/posthoc.py): each closed form against an
independent numpy computation, the residual MLP against its Procrustes start, the charts, and the
methods' fit on a frozen given encoder."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrator.geometry import lorentz
from orchestrator.methods import create_method
from orchestrator.methods.base import TrainContext
from orchestrator.methods.posthoc import HISTORY, fit_error, fit_residual_mlp, low_rank_affine, mean_map_error, procrustes_matrix
from orchestrator.methods.posthoc_descriptions import ResidualMLPParams
from orchestrator.models.adapters import BACKWARD_ADAPTER, ChartMap, adapter_spec, build_adapter
from orchestrator.models.adapters.posthoc import LowRankAffineAdapter, ResidualMLPAdapter, to_chart
from orchestrator.training.loop import freeze
from vector_models import vector_model


def _orthogonal(n: int, seed: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))
    return q * np.sign(np.diag(r))


@pytest.mark.parametrize("n, m", [(6, 6), (8, 5), (5, 8)])
def test_procrustes_is_numpys_svd_solution(n, m):
    rng = np.random.default_rng(n * 10 + m)
    x, y = rng.standard_normal((300, n)), rng.standard_normal((300, m))
    u, singular, vt = np.linalg.svd(y.T @ x, full_matrices=False)
    scale = singular.sum() / np.sum(x ** 2)
    got = procrustes_matrix(torch.from_numpy(x), torch.from_numpy(y)).numpy()
    np.testing.assert_allclose(got, scale * (u @ vt), atol=1e-10)
    # a scaled semi-orthogonal matrix: orthonormal rows (m <= n) or columns (m >= n) times s
    gram = got @ got.T if m <= n else got.T @ got
    np.testing.assert_allclose(gram, scale ** 2 * np.eye(min(n, m)), atol=1e-10)
    # no other semi-orthogonal matrix fits better, at its own best scale (random ones drawn by QR)
    best = np.sum((x @ got.T - y) ** 2)
    for seed in range(20):
        other = _orthogonal(max(n, m), seed)[:m, :n]
        mapped = x @ other.T
        own_scale = max(np.sum(mapped * y) / np.sum(mapped ** 2), 0.0)
        assert np.sum((own_scale * mapped - y) ** 2) >= best - 1e-9


def test_procrustes_recovers_a_scaled_rotation():
    x = np.random.default_rng(1).standard_normal((100, 7))
    rotation = _orthogonal(7, 3)
    got = procrustes_matrix(torch.from_numpy(x), torch.from_numpy(0.3 * x @ rotation.T)).numpy()
    np.testing.assert_allclose(got, 0.3 * rotation, atol=1e-10)


@pytest.mark.parametrize("rank", [1, 3, 6])
def test_low_rank_affine_is_reduced_rank_regression(rank):
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((400, 9))
    y = x @ rng.standard_normal((9, 6)) + 0.3 * rng.standard_normal((400, 6)) + rng.standard_normal(6)
    left, right, bias = low_rank_affine(torch.from_numpy(x), torch.from_numpy(y), rank, ridge=0.0)
    weight = (left @ right.T).numpy()
    assert np.linalg.matrix_rank(weight) == rank
    # independent: least squares with an intercept column (numpy), then Eckart-Young on its fitted values
    design = np.hstack([x, np.ones((400, 1))])
    solution, *_ = np.linalg.lstsq(design, y, rcond=None)
    fitted = design @ solution
    centred = fitted - fitted.mean(axis=0)
    singular = np.linalg.svd(centred, compute_uv=False)
    expected = np.sum((y - fitted) ** 2) + np.sum(singular[rank:] ** 2)
    got = np.sum((x @ weight.T + bias.numpy() - y) ** 2)
    np.testing.assert_allclose(got, expected, rtol=1e-9)
    if rank == 6:  # full rank: the least-squares map itself
        np.testing.assert_allclose(weight, solution[:9].T, atol=1e-9)
        np.testing.assert_allclose(bias.numpy(), solution[9], atol=1e-9)


def test_residual_mlp_starts_at_procrustes_and_fits_what_it_cannot():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1500, 5, generator=gen)
    y = x @ torch.from_numpy(_orthogonal(5, 1)).float().T + 0.5 * torch.tanh(3 * x[:, :1])  # a bent rotation
    procrustes = fit_error(x.double() @ procrustes_matrix(x, y).T, y.double())
    start = ResidualMLPAdapter(5, 5, 32)
    with torch.no_grad():
        start.base.copy_(procrustes_matrix(x, y).float())
        torch.testing.assert_close(start(x), x @ start.base.T)  # zero residual at the start
    torch.manual_seed(0)
    params = ResidualMLPParams(hidden_dim=32, epochs=60, lr=3e-3, batch_size=128, weight_decay=0.0)
    adapter, losses = fit_residual_mlp(x, y, params, torch.Generator().manual_seed(1))
    assert len(losses) == 60 and losses[-1] < 0.2 * procrustes
    torch.testing.assert_close(adapter.base, procrustes_matrix(x, y).float())  # R stays fixed


def test_chart_map_between_lorentz_spaces_is_an_isometry_for_a_rotation():
    points = lorentz.expmap0(0.5 * torch.randn(40, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64),
                             1.0)
    rotation = build_adapter({"kind": "affine", "in_dim": 6, "out_dim": 6, "bias": False}).double()
    with torch.no_grad():
        rotation.linear.weight.copy_(torch.from_numpy(_orthogonal(6, 2)))
    chart_map = ChartMap(rotation, "lorentz", 1.0, "lorentz", 1.0)
    mapped = chart_map(points)
    torch.testing.assert_close(lorentz.inner(mapped, mapped), torch.full((40,), -1.0, dtype=torch.float64))
    torch.testing.assert_close(lorentz.pairwise_distance(mapped, mapped, 1.0), lorentz.pairwise_distance(points, points, 1.0))
    rebuilt = build_adapter(adapter_spec(chart_map)).double()
    rebuilt.load_state_dict(chart_map.state_dict())
    torch.testing.assert_close(rebuilt(points), mapped)


def test_chart_map_from_cosine_normalises_and_low_rank_spec_round_trips():
    adapter = LowRankAffineAdapter(4, 3, 2)
    with torch.no_grad():
        for parameter in adapter.parameters():
            parameter.normal_()
    chart_map = ChartMap(adapter, "cosine", 1.0, "euclidean", 1.0)
    x = torch.randn(10, 4)
    torch.testing.assert_close(chart_map(5 * x), adapter(x / x.norm(dim=1, keepdim=True)))
    assert adapter_spec(chart_map)["map"] == {"kind": "low_rank_affine", "in_dim": 4, "out_dim": 3, "rank": 2}


@pytest.mark.parametrize("name, params", [
    ("procrustes", {}),
    ("low_rank_affine", {"rank": 4}),
    ("residual_mlp", {"epochs": 5, "hidden_dim": 16}),
])
def test_method_fits_its_map_on_the_paired_sample_and_keeps_the_encoder(name, params):
    parent_method = create_method("hbct", {"clip": 1.0})
    method = create_method(name, {"space": "cosine", "pairs": 150, **params})
    assert not method.trains_encoder
    images = torch.randn(200, 12, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(200) % 4
    data = [(images[i], int(labels[i]), i) for i in range(200)]
    parent = freeze(vector_model(parent_method, 12, 6, 4, seed=1))
    new = freeze(vector_model(method, 12, 8, 4, seed=2))
    weights = {k: v.clone() for k, v in new.encoder.state_dict().items()}
    ctx = TrainContext(new_model=new, old_model=parent, train_data=data, num_classes=4)
    method.on_train_end(ctx)
    assert all(torch.equal(weights[k], v) for k, v in new.encoder.state_dict().items())
    backward = new.adapters[BACKWARD_ADAPTER]
    assert isinstance(backward, ChartMap) and backward.target_space.value == "lorentz"
    # the fit, recomputed here on the same draw of 150 items
    chosen = torch.randperm(200, generator=torch.Generator().manual_seed(0))[:150].sort().values
    with torch.no_grad():
        old_chart = to_chart(parent(images[chosen]).embedding, "lorentz", 1.0)
        new_chart = to_chart(new(images[chosen]).embedding, "cosine", 1.0)
        mapped = backward(new(images[chosen]).embedding)
    assert mapped.shape == (150, 7)
    history = [h["loss"] for h in ctx.state[HISTORY]]
    np.testing.assert_allclose(history[0], mean_map_error(old_chart.double()), rtol=1e-5)
    np.testing.assert_allclose(history[-1], fit_error(lorentz.logmap0(mapped, 1.0).double(), old_chart.double()),
                               rtol=1e-4)
    if name == "procrustes":
        expected = procrustes_matrix(new_chart, old_chart).float()
        torch.testing.assert_close(backward.map.linear.weight, expected)
