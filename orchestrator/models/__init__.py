"""Models layer: encoders (timm backbone + projection + space lift), heads, adapters, weight loading,
the generation checkpoint format."""
from orchestrator.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "adapters": [
        "BACKWARD_ADAPTER", "FORWARD_ADAPTER", "AffineAdapter", "EmbeddingMap", "MLPAdapter",
        "OrthogonalAdapter", "adapter_spec", "build_adapter", "gram_deviation",
        "lambda_orthogonality_penalty", "register_adapter", "truncate_to_common",
    ],
    "checkpoint": [
        "CARD_FORMAT_VERSION", "CheckpointCard", "MethodSpec", "checkpoint_exists", "describe_adapters", "load_card",
        "read_weights", "rebuild_adapters", "restore_weights", "save_generation",
    ],
    "checkpoint_layout": ["CARD_FILE", "WEIGHTS_FILE"],
    "curvature": ["LearnableCurvature"],
    "encoder": ["Encoder", "adapt_stem_to_small_input"],
    "encoder_config": ["EncoderConfig"],
    "heads": [
        "CosineHead", "DSimplexHead", "LinearHead", "LorentzMLR", "PoincarePrototypeHead",
        "dsimplex_finetune_targets", "expand_linear_head", "simplex_prototypes_in_ball",
    ],
    "lifts": ["CosineLift", "EuclideanLift", "LorentzLift", "PoincareLift", "build_lift", "clip_norm"],
    "outputs": ["ModelOutput"],
    "weights": ["LoadReport", "create_hub_backbone", "load_encoder_weights", "read_state_dict", "split_encoder_state"],
})
