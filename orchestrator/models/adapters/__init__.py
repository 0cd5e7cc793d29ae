"""Adapters between embedding spaces: the modules (``layers``, the post-hoc maps' ``posthoc``) and
the registry of adapter kinds that checkpoints describe and rebuild them through (``registry``)."""

from orchestrator.models.adapters.layers import (
    GRAM_EPS,
    AffineAdapter,
    EmbeddingMap,
    MLPAdapter,
    OrthogonalAdapter,
    gram_deviation,
    lambda_orthogonality_penalty,
    truncate_to_common,
)
from orchestrator.models.adapters.posthoc import (
    ChartMap,
    LowRankAffineAdapter,
    QueryInterpolation,
    ResidualMLPAdapter,
    spherical_interpolation,
)
from orchestrator.models.adapters.registry import (
    BACKWARD_ADAPTER,
    FORWARD_ADAPTER,
    adapter_class,
    adapter_spec,
    available_adapters,
    build_adapter,
    register_adapter,
)

__all__ = [
    "BACKWARD_ADAPTER",
    "FORWARD_ADAPTER",
    "GRAM_EPS",
    "AffineAdapter",
    "ChartMap",
    "EmbeddingMap",
    "LowRankAffineAdapter",
    "MLPAdapter",
    "OrthogonalAdapter",
    "QueryInterpolation",
    "ResidualMLPAdapter",
    "adapter_class",
    "adapter_spec",
    "available_adapters",
    "build_adapter",
    "gram_deviation",
    "lambda_orthogonality_penalty",
    "register_adapter",
    "spherical_interpolation",
    "truncate_to_common",
]
