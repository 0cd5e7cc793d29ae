"""Models layer: encoders (timm backbone + projection + space lift), heads, adapters, weight loading."""

from orchestrator.models.adapters import (
    BACKWARD_ADAPTER,
    FORWARD_ADAPTER,
    AffineAdapter,
    EmbeddingMap,
    MLPAdapter,
    OrthogonalAdapter,
    adapter_spec,
    build_adapter,
    gram_deviation,
    lambda_orthogonality_penalty,
    register_adapter,
    truncate_to_common,
)
from orchestrator.models.curvature import LearnableCurvature
from orchestrator.models.encoder import Encoder, EncoderConfig, adapt_stem_to_small_input
from orchestrator.models.heads import (
    CosineHead,
    DSimplexHead,
    LinearHead,
    LorentzMLR,
    PoincarePrototypeHead,
    dsimplex_finetune_targets,
    expand_linear_head,
    simplex_prototypes_in_ball,
)
from orchestrator.models.lifts import CosineLift, EuclideanLift, LorentzLift, PoincareLift, build_lift, clip_norm
from orchestrator.models.outputs import ModelOutput
from orchestrator.models.weights import LoadReport, create_hub_backbone, load_backbone_weights, read_state_dict

__all__ = [
    "BACKWARD_ADAPTER",
    "FORWARD_ADAPTER",
    "AffineAdapter",
    "CosineHead",
    "CosineLift",
    "DSimplexHead",
    "EmbeddingMap",
    "Encoder",
    "EncoderConfig",
    "EuclideanLift",
    "LearnableCurvature",
    "LinearHead",
    "LoadReport",
    "LorentzLift",
    "LorentzMLR",
    "MLPAdapter",
    "ModelOutput",
    "OrthogonalAdapter",
    "PoincareLift",
    "PoincarePrototypeHead",
    "adapt_stem_to_small_input",
    "adapter_spec",
    "build_adapter",
    "build_lift",
    "clip_norm",
    "create_hub_backbone",
    "dsimplex_finetune_targets",
    "expand_linear_head",
    "gram_deviation",
    "lambda_orthogonality_penalty",
    "load_backbone_weights",
    "read_state_dict",
    "register_adapter",
    "simplex_prototypes_in_ball",
    "truncate_to_common",
]
