"""Retrieval accuracy (CMC@k, mAP) and the compatibility metrics built on it."""

from orchestrator.metrics.compatibility import (
    GenerationEmbeddings,
    PerturbationScores,
    average_compatibility,
    average_multi_model_accuracy,
    backfill_curve_area,
    compatibility_matrices,
    compatibility_matrix,
    empirically_compatible,
    p_com,
    p_up,
    perturbation_scores,
)
from orchestrator.metrics.retrieval import (
    RetrievalResult,
    cmc_at_k,
    default_chunk_size,
    mean_average_precision,
    ranked_list_metrics,
    retrieval_metrics,
    retrieval_metrics_from_distances,
)

__all__ = [
    "GenerationEmbeddings",
    "PerturbationScores",
    "RetrievalResult",
    "average_compatibility",
    "average_multi_model_accuracy",
    "backfill_curve_area",
    "cmc_at_k",
    "compatibility_matrices",
    "compatibility_matrix",
    "default_chunk_size",
    "empirically_compatible",
    "mean_average_precision",
    "p_com",
    "p_up",
    "perturbation_scores",
    "ranked_list_metrics",
    "retrieval_metrics",
    "retrieval_metrics_from_distances",
]
