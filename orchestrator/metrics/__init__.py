"""Retrieval accuracy (CMC@k, mAP) and the compatibility metrics built on it."""
from orchestrator.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "names": ["KEY_METRICS", "METRICS", "NORMALISED_SCORES", "UPDATE_SCORES"],
    "compatibility": [
        "MIN_NORMALISER", "GenerationEmbeddings",
        "PerturbationScores", "average_compatibility", "average_multi_model_accuracy",
        "backfill_curve_area", "backfill_saved", "compatibility_matrices", "compatibility_matrix",
        "empirically_compatible", "format_value", "p_com", "p_up", "perturbation_scores", "reported_p_up",
        "update_summary",
    ],
    "retrieval": [
        "RetrievalResult", "cmc_at_k", "default_chunk_size", "map_of_average_precisions",
        "mean_average_precision", "paired_difference_standard_error", "ranked_list_metrics", "retrieval_metrics",
        "retrieval_metrics_from_distances",
    ],
})
