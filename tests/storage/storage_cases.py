"""Shared helpers of the storage tests: tiny models of several methods and exact comparisons."""
import torch

from orchestrator.methods.fct import build_forward_map
from orchestrator.methods.lambda_orth import BACKWARD_ADAPTER, FORWARD_ADAPTER, build_adapters
from orchestrator.methods.registry import create_method
from orchestrator.models.encoder import EncoderConfig

ENCODER = EncoderConfig(arch="test_resnet", embed_dim=8)

#: (case id, method name, params, adapters spec or None)
CASES = [
    ("independent-cosine", "independent", {"space": "cosine"}, None),
    ("hbct-lorentz", "hbct", {}, None),
    ("dsimplex", "dsimplex", {}, None),
    ("lambda-orth-orthogonal", "lambda_orth", {}, dict(old_dim=6, variant="orthogonal", normalize=True)),
    ("lambda-orth-lambda", "lambda_orth", {"variant": "lambda", "space": "euclidean"},
     dict(old_dim=10, variant="lambda", normalize=False)),
    # FCT: a lone forward map F (an MLP, or affine)
    ("fct-mlp", "fct", {"hidden_dim": 16}, dict(old_dim=6, form="mlp", hidden_dim=16, normalize=True)),
    ("fct-affine", "fct", {"form": "affine", "space": "euclidean"},
     dict(old_dim=10, form="affine", hidden_dim=None, normalize=False)),
]


def build_case(method_name, params, adapters, seed=0):
    """(method, model): a tiny model with random weights, non-trivial BatchNorm statistics and,
    for lambda_orth and fct, perturbed adapters."""
    torch.manual_seed(seed)
    method = create_method(method_name, params)
    model = method.build_model(ENCODER, num_classes=4, seen_classes=[0, 1])
    if adapters is not None and "form" in adapters:
        model.adapters[FORWARD_ADAPTER] = build_forward_map(adapters["old_dim"], ENCODER.embed_dim, adapters["form"],
                                                            adapters["hidden_dim"] or 1, adapters["normalize"])
    elif adapters is not None:
        backward, forward = build_adapters(adapters["old_dim"], ENCODER.embed_dim, adapters["variant"], adapters["normalize"])
        model.adapters[BACKWARD_ADAPTER] = backward
        model.adapters[FORWARD_ADAPTER] = forward
    with torch.no_grad():
        for param in model.adapters.parameters():
            param.add_(0.1 * torch.randn_like(param))
        model.train()
        model(torch.randn(4, 3, 16, 16))  # BatchNorm running statistics away from their init
    return method, model.eval()


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and sa[key].shape == sb[key].shape, key
        assert torch.equal(sa[key], sb[key]), key


@torch.no_grad()
def assert_same_outputs(a, b, adapters):
    a.eval(), b.eval()
    images = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    out_a, out_b = a(images), b(images)
    for field in ("features", "embedding", "logits"):
        assert torch.equal(getattr(out_a, field), getattr(out_b, field)), field
    if adapters is not None:
        if "form" not in adapters:
            assert torch.equal(a.adapters[BACKWARD_ADAPTER](out_a.embedding), b.adapters[BACKWARD_ADAPTER](out_b.embedding))
        else:
            assert set(b.adapters) == {FORWARD_ADAPTER}
        old = torch.randn(3, adapters["old_dim"])
        assert torch.equal(a.adapters[FORWARD_ADAPTER](old), b.adapters[FORWARD_ADAPTER](old))
