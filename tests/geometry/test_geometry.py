"""``Geometry``: every per-space rule checked against formulas written out directly in numpy here."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from orchestrator.geometry import FLAT_CURVATURE, Geometry, Space

TOL = 1e-12


def _tangent(n: int, d: int, seed: int, scale: float = 0.6) -> np.ndarray:
    return scale * np.random.default_rng(seed).standard_normal((n, d))


def _lorentz_points(n: int, d: int, curv: float, seed: int) -> np.ndarray:
    """Points of the hyperboloid <x,x>_L = -1/c, time first, built in numpy (expmap0, HBCT §2)."""
    v = _tangent(n, d, seed)
    norm = np.linalg.norm(v, axis=1, keepdims=True)
    space = np.sinh(np.sqrt(curv) * norm) * v / (np.sqrt(curv) * norm)
    time = np.sqrt(1.0 / curv + (space**2).sum(axis=1, keepdims=True))
    return np.concatenate([time, space], axis=1)


def _ball_points(n: int, d: int, curv: float, seed: int) -> np.ndarray:
    """Points of the Poincaré ball of radius 1/sqrt(c) (p = x_s / (1 + sqrt(c) x_t), eq. 12)."""
    x = _lorentz_points(n, d, curv, seed)
    return x[:, 1:] / (1.0 + np.sqrt(curv) * x[:, :1])


def _lorentz_distance(q: np.ndarray, g: np.ndarray, curv: float) -> np.ndarray:
    """arccosh(-c <q,g>_L) / sqrt(c) (HBCT eq. 3), (Nq, D), (Ng, D) -> (Nq, Ng)."""
    inner = q[:, 1:] @ g[:, 1:].T - np.outer(q[:, 0], g[:, 0])
    return np.arccosh(np.maximum(-curv * inner, 1.0)) / np.sqrt(curv)


def _poincare_distance(p: np.ndarray, r: np.ndarray, curv: float) -> np.ndarray:
    """arccosh(1 + 2c||p-r||^2 / ((1-c||p||^2)(1-c||r||^2))) / sqrt(c), (Np, d), (Nr, d) -> (Np, Nr)."""
    diff_sq = ((p[:, None, :] - r[None, :, :]) ** 2).sum(-1)
    denominator = np.outer(1.0 - curv * (p**2).sum(1), 1.0 - curv * (r**2).sum(1))
    return np.arccosh(1.0 + 2.0 * curv * diff_sq / denominator) / np.sqrt(curv)


@pytest.mark.parametrize("curv", [0.5, 1.0, 2.0])
def test_lorentz_pairwise_distance_is_the_arccosh_of_the_lorentz_inner_product(curv):
    q, g = _lorentz_points(7, 5, curv, 0), _lorentz_points(9, 5, curv, 1)
    expected = _lorentz_distance(q, g, curv)
    geometry = Geometry("lorentz", curv)
    np.testing.assert_allclose(geometry.pairwise_distance(q, g), expected, rtol=0, atol=TOL)  # numpy in, out
    torch_out = geometry.pairwise_distance(torch.from_numpy(q), torch.from_numpy(g))
    assert isinstance(torch_out, torch.Tensor) and torch_out.dtype == torch.float64
    np.testing.assert_allclose(torch_out.numpy(), expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("curv", [0.1, 1.0])
def test_poincare_pairwise_distance_is_the_arccosh_closed_form(curv):
    p, r = _ball_points(6, 4, curv, 2), _ball_points(8, 4, curv, 3)
    np.testing.assert_allclose(Geometry(Space.POINCARE, curv).pairwise_distance(p, r),
                               _poincare_distance(p, r, curv), rtol=0, atol=TOL)


def test_flat_pairwise_distances():
    q, g = _tangent(5, 6, 4), _tangent(7, 6, 5)
    q[0] = 0.0
    l2 = np.sqrt(((q[:, None, :] - g[None, :, :]) ** 2).sum(-1))
    np.testing.assert_allclose(Geometry("euclidean").pairwise_distance(q, g), l2, rtol=0, atol=TOL)
    cos = (q @ g.T) / np.maximum(np.outer(np.linalg.norm(q, axis=1), np.linalg.norm(g, axis=1)), 1e-300)
    np.testing.assert_allclose(Geometry("cosine").pairwise_distance(q, g), 1.0 - cos, rtol=0, atol=TOL)


@pytest.mark.parametrize("curv", [0.5, 1.0])
def test_lorentz_coordinates_are_the_ball_points_and_the_hyperboloid_points(curv):
    x = _lorentz_points(10, 3, curv, 6)
    geometry = Geometry("lorentz", curv)
    ball = geometry.coordinates(x)
    assert isinstance(ball, np.ndarray) and ball.dtype == np.float64 and ball.shape == (10, 3)
    np.testing.assert_allclose(ball, x[:, 1:] / (1.0 + np.sqrt(curv) * x[:, :1]), rtol=0, atol=TOL)
    drifted = x.copy()
    drifted[:, 0] += 1e-3  # the time coordinate is recomputed from the space part
    np.testing.assert_allclose(geometry.coordinates(drifted, hyperbolic_model="lorentz"), x, rtol=0, atol=TOL)


@pytest.mark.parametrize("curv", [0.1, 1.0])
def test_poincare_coordinates_map_to_the_hyperboloid(curv):
    p = _ball_points(10, 3, curv, 7)
    geometry = Geometry("poincare", curv)
    np.testing.assert_array_equal(geometry.coordinates(p), p)
    space = 2.0 * p / (1.0 - curv * (p**2).sum(1, keepdims=True))
    expected = np.concatenate([np.sqrt(1.0 / curv + (space**2).sum(1, keepdims=True)), space], axis=1)
    lifted = geometry.coordinates(p, hyperbolic_model="lorentz")
    np.testing.assert_allclose(lifted, expected, rtol=1e-13, atol=TOL)
    inner = (lifted[:, 1:] ** 2).sum(1) - lifted[:, 0] ** 2
    np.testing.assert_allclose(inner, -1.0 / curv, rtol=1e-12)


def test_flat_coordinates():
    x = _tangent(6, 4, 8)
    x[2] = 0.0
    np.testing.assert_array_equal(Geometry("euclidean").coordinates(x), x)
    normalised = Geometry("cosine").coordinates(x)
    rows = [0, 1, 3, 4, 5]
    np.testing.assert_allclose(normalised[rows], x[rows] / np.linalg.norm(x[rows], axis=1, keepdims=True), rtol=0, atol=TOL)
    np.testing.assert_array_equal(normalised[2], np.zeros(4))  # a zero vector stays zero


@pytest.mark.parametrize("space,curv", [("lorentz", 0.5), ("poincare", 0.1), ("euclidean", 1.0), ("cosine", 1.0)])
@pytest.mark.parametrize("model", ["poincare", "lorentz"])
def test_coordinate_distance_equals_the_embedding_distance(space, curv, model):
    """Row-wise, with broadcasting (Q, 1, d') x (Q, F, d'): the index's refine step."""
    make = {"lorentz": _lorentz_points, "poincare": _ball_points}.get(space, lambda n, d, c, s: _tangent(n, d, s))
    q, g = make(4, 3, curv, 9), make(6, 3, curv, 10)
    expected = {"lorentz": lambda: _lorentz_distance(q, g, curv),
                "poincare": lambda: _poincare_distance(q, g, curv),
                "euclidean": lambda: np.sqrt(((q[:, None] - g[None]) ** 2).sum(-1)),
                "cosine": lambda: 1.0 - (q / np.linalg.norm(q, axis=1, keepdims=True))
                @ (g / np.linalg.norm(g, axis=1, keepdims=True)).T}[space]()
    geometry = Geometry(space, curv)
    cq, cg = geometry.coordinates(q, hyperbolic_model=model), geometry.coordinates(g, hyperbolic_model=model)
    got = geometry.coordinate_distance(cq[:, None, :], np.broadcast_to(cg, (4, 6, cg.shape[1])), hyperbolic_model=model)
    assert got.shape == (4, 6)
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("curv", [0.5, 1.0, 3.0])
def test_uncertainty_is_one_minus_space_norm_over_time(curv):
    x = _lorentz_points(8, 4, curv, 11)
    norm = np.linalg.norm(x[:, 1:], axis=1)
    expected = 1.0 - norm / np.sqrt(1.0 / curv + norm**2)
    np.testing.assert_allclose(Geometry("lorentz", curv).uncertainty(x), expected, rtol=0, atol=TOL)
    as_float32 = Geometry("lorentz", curv).uncertainty(torch.from_numpy(x).float())
    assert as_float32.dtype == torch.float32 and as_float32.shape == (8,)


@pytest.mark.parametrize("space", ["euclidean", "cosine", "poincare"])
def test_uncertainty_is_nan_where_the_space_defines_none(space):
    out = Geometry(space, 0.5).uncertainty(torch.zeros(3, 5, 4, dtype=torch.float32))
    assert out.shape == (3, 5) and out.dtype == torch.float32 and torch.isnan(out).all()


def test_curvature_is_canonical():
    assert Geometry("euclidean", 0.0).curv == FLAT_CURVATURE == 1.0  # flat lifts report 0
    assert Geometry("cosine", -3.0).curv == 1.0
    assert Geometry("lorentz", np.float32(0.5)).curv == 0.5 and type(Geometry("lorentz", np.float32(0.5)).curv) is float
    assert Geometry("poincare", 2).curv == 2.0
    learned = torch.tensor(0.7, requires_grad=True)
    assert Geometry("lorentz", learned).curv is learned
    assert Geometry("lorentz", 0.5) == Geometry(Space.LORENTZ, 0.5) and Geometry("euclidean", 0) == Geometry("euclidean")


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), True, "1"])
def test_invalid_hyperbolic_curvature_is_refused(bad):
    with pytest.raises(ValueError, match="curv"):
        Geometry("lorentz", bad)


def test_invalid_space_and_model_are_refused():
    with pytest.raises(ValueError, match="'hamming'"):
        Geometry("hamming")
    with pytest.raises(ValueError, match="hyperbolic_model.*'klein'"):
        Geometry("poincare", 1.0).coordinates(np.zeros((1, 2)), hyperbolic_model="klein")


def test_learnable_curvature_gets_the_finite_difference_gradient():
    q, g = _lorentz_points(3, 2, 1.0, 12)[:, 1:], _lorentz_points(4, 2, 1.0, 13)[:, 1:]

    def total(c: float) -> float:  # distances between the points above q_s, g_s at curvature c (numpy)
        lift = lambda s: np.concatenate([np.sqrt(1.0 / c + (s**2).sum(1, keepdims=True)), s], axis=1)  # noqa: E731
        return float(_lorentz_distance(lift(q), lift(g), c).sum())

    curv = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    geometry = Geometry("lorentz", curv)
    lift = lambda s: geometry.coordinates(torch.cat([torch.zeros(len(s), 1, dtype=torch.float64), torch.from_numpy(s)], 1),  # noqa: E731
                                          hyperbolic_model="lorentz")
    geometry.pairwise_distance(lift(q), lift(g)).sum().backward()
    step = 1e-6
    assert curv.grad.item() == pytest.approx((total(0.8 + step) - total(0.8 - step)) / (2 * step), rel=1e-6)


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="queries"):
        Geometry("euclidean").pairwise_distance(np.zeros((2, 3)), np.zeros((2, 4)))


def test_check_points():
    Geometry("poincare", 1.0).check_points(_ball_points(5, 3, 1.0, 14))
    with pytest.raises(ValueError, match="inside the ball of radius 1/sqrt\\(curv\\) = 2"):
        Geometry("poincare", 0.25).check_points(np.array([[2.0, 0.0]]))
    with pytest.raises(ValueError, match="lorentz embeddings must be \\(N, d\\+1\\)"):
        Geometry("lorentz", 1.0).check_points(np.zeros((3, 1)))
    with pytest.raises(ValueError, match="at least one column"):
        Geometry("cosine").check_points(np.zeros((3, 0)))


def test_the_geometry_layer_imports_no_ray_index_or_pipeline_module():
    code = ("import sys, orchestrator.geometry; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray' or m.startswith(('orchestrator.index', "
            "'orchestrator.pipeline', 'orchestrator.distributed', 'orchestrator.search'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
