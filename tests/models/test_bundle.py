"""``CompatibleModel.load_generation_weights``: a fine-tuned generation starts from its parent's
weights and keeps the classes it trains on."""
from __future__ import annotations

import pytest
import torch

from orchestrator.methods import create_method
from orchestrator.models.encoder import EncoderConfig

ENCODER = EncoderConfig(arch="test_resnet", embed_dim=9, small_input=False)


def test_a_child_that_sees_more_classes_starts_from_its_parents_weights():
    method = create_method("dsimplex")
    torch.manual_seed(0)
    parent = method.build_model(ENCODER, 10, torch.arange(5))
    torch.manual_seed(1)
    child = method.build_model(ENCODER, 10, torch.arange(10))
    assert not torch.equal(child.encoder.projection.weight, parent.encoder.projection.weight)

    child.load_generation_weights(parent.deployable_state_dict())

    assert torch.equal(child.seen_classes, torch.arange(10))  # its own classes, not the parent's 5
    weights = {k: v for k, v in parent.state_dict().items() if k != "seen_classes"}
    assert weights and all(torch.equal(child.state_dict()[k], v) for k, v in weights.items())
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(child.eval()(images).embedding, parent.eval()(images).embedding)


def test_a_state_without_some_weights_is_refused():
    method = create_method("dsimplex")
    parent = method.build_model(ENCODER, 10, torch.arange(5))
    child = method.build_model(ENCODER, 10, torch.arange(10))
    state = {k: v for k, v in parent.deployable_state_dict().items() if not k.startswith("encoder.projection.")}
    with pytest.raises(RuntimeError, match="missing keys.*encoder.projection"):
        child.load_generation_weights(state)
