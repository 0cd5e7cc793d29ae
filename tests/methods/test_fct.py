"""FCT's forward transformation F (methods/fct.py): the fit recovers known maps, the stored map
normalises its input, and the method stores F alone after training."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from orchestrator.methods import create_method
from orchestrator.methods.base import TrainContext
from orchestrator.methods.descriptions import FCTParams
from orchestrator.methods.fct import build_forward_map, fit_forward_map, forward_loss
from orchestrator.methods.lambda_orth import BACKWARD_ADAPTER, FORWARD_ADAPTER
from orchestrator.models.adapters import AffineAdapter, MLPAdapter
from vector_models import vector_model


def test_affine_fit_recovers_a_known_affine_map():
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(2000, 6, generator=gen)
    weight, bias = torch.randn(9, 6, generator=gen), torch.randn(9, generator=gen)
    new = old @ weight.T + bias
    params = FCTParams(space="euclidean", form="affine", adapter_epochs=60, adapter_lr=2e-2)
    forward, history = fit_forward_map(old, new, params, generator=torch.Generator().manual_seed(1))
    assert isinstance(forward.map, AffineAdapter) and not bool(forward.normalize_input)
    assert len(history) == 60 and history[-1]["loss"] < 1e-3 * history[0]["loss"]
    torch.testing.assert_close(forward.map.weight.detach(), weight, atol=2e-3, rtol=0)
    torch.testing.assert_close(forward.map.bias.detach(), bias, atol=2e-3, rtol=0)
    with torch.no_grad():
        mse = (forward(old) - new).pow(2).sum(dim=1).mean()
    assert mse < 1e-4


def test_mlp_fit_recovers_a_non_linear_map_better_than_any_affine_one():
    gen = torch.Generator().manual_seed(2)
    old = torch.randn(3000, 4, generator=gen)
    a, c = torch.randn(16, 4, generator=gen), torch.randn(5, 16, generator=gen) / 4
    new = torch.relu(old @ a.T) @ c.T  # a ReLU network of the MLP's form, hidden width 16
    torch.manual_seed(3)
    params = FCTParams(space="euclidean", hidden_dim=64, adapter_epochs=150, adapter_lr=3e-3, adapter_batch_size=128)
    forward, history = fit_forward_map(old, new, params, generator=torch.Generator().manual_seed(4))
    assert isinstance(forward.map, MLPAdapter) and forward.map.hidden_dim == 64
    with torch.no_grad():
        mse = float((forward(old) - new).pow(2).sum(dim=1).mean())
    variance = float((new - new.mean(0)).pow(2).sum(dim=1).mean())
    # the best affine map, by least squares (independent of the Adam fit)
    design = torch.cat([old, torch.ones(len(old), 1)], dim=1).double()
    solution = torch.linalg.lstsq(design, new.double()).solution
    affine_mse = float((design @ solution - new.double()).pow(2).sum(dim=1).mean())
    assert mse < 1e-3 * variance
    assert mse < 1e-2 * affine_mse
    assert history[-1]["loss"] == pytest.approx(mse, rel=0.5)  # last epoch's running mean vs final fit


def test_cosine_fit_ignores_norms_and_the_loss_is_the_summed_squared_error():
    gen = torch.Generator().manual_seed(5)
    forward = build_forward_map(6, 4, "mlp", 32, normalize_inputs=True)
    old, new = torch.randn(10, 6, generator=gen), torch.randn(10, 4, generator=gen)
    scales = torch.rand(10, 1, generator=gen) * 5 + 0.1
    with torch.no_grad():
        torch.testing.assert_close(forward(old * scales), forward(old))
        by_hand = (forward.map(F.normalize(old, dim=1)) - new / new.norm(dim=1, keepdim=True)).pow(2).sum(dim=1).mean()
        torch.testing.assert_close(forward_loss(forward, old, new * scales, normalize_targets=True), by_hand)
    params = FCTParams()
    assert params.space == "cosine" and params.inputs_normalized() and params.form == "mlp"
    assert not FCTParams(space="euclidean").inputs_normalized()
    assert FCTParams(normalize_inputs=False).inputs_normalized() is False


def test_fit_refuses_mismatched_or_empty_inputs():
    with pytest.raises(ValueError, match="same N"):
        fit_forward_map(torch.randn(5, 3), torch.randn(4, 3), FCTParams())
    with pytest.raises(ValueError, match="N = 0"):
        fit_forward_map(torch.randn(0, 3), torch.randn(0, 3), FCTParams())
    with pytest.raises(ValueError, match="form must be"):
        build_forward_map(3, 3, "conv", 8, True)


class VectorData(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def test_on_train_end_stores_f_alone_fitted_from_the_parent_to_this_model():
    method = create_method("fct", {"adapter_epochs": 40, "hidden_dim": 32})
    parent = vector_model(create_method("independent"), in_dim=5, embed_dim=6, num_classes=3, seed=0).eval()
    child = vector_model(method, in_dim=5, embed_dim=8, num_classes=3, seed=1).eval()
    gen = torch.Generator().manual_seed(6)
    data = VectorData(torch.randn(300, 5, generator=gen), torch.randint(0, 3, (300,), generator=gen))
    ctx = TrainContext(new_model=child, old_model=parent, train_data=data, num_classes=3)
    method.on_train_end(ctx)
    assert set(child.adapters) == {FORWARD_ADAPTER} and BACKWARD_ADAPTER not in child.adapters
    history = ctx.state["fct_history"]
    assert len(history) == 40 and history[-1]["loss"] < history[0]["loss"]
    with torch.no_grad():
        old, new = parent(data.x).embedding, child(data.x).embedding
        mapped = child.adapters[FORWARD_ADAPTER](old)
    assert mapped.shape == (300, 8)
    error = (mapped - F.normalize(new, dim=1)).pow(2).sum(dim=1).mean()
    assert error == pytest.approx(history[-1]["loss"], rel=0.5)
    with pytest.raises(ValueError, match="needs a parent generation"):
        method.on_train_end(TrainContext(new_model=child, old_model=None, train_data=data, num_classes=3))
