"""Evaluation of trained generations without Ray.

- ``generations``: the compatibility matrices of a set of generations on one query/gallery split
  (every generation embeds the split once; each pair compared along its comparison path).
- ``update_experiment``: a one-off compatible-update experiment on an in-memory dataset (old,
  reference and new models trained and evaluated; ``orchestrator demo``, ``examples/quickstart.py``).

The other evaluations live with what they evaluate: a mixed-generation gallery
(``orchestrator.gallery.mixed_evaluation``), what the search router returns
(``orchestrator.search.router_evaluation``), the pipeline's ``evaluate:<gen>`` step
(``orchestrator.pipeline.evaluate_step``); the scores themselves are ``orchestrator.metrics``.
"""
from orchestrator.evaluation.generations import (
    CompatibilityReport,
    SplitEmbeddings,
    compare_generations,
    embed_split,
    evaluate_generations,
    sample_split,
)

__all__ = [
    "CompatibilityReport",
    "SplitEmbeddings",
    "compare_generations",
    "embed_split",
    "evaluate_generations",
    "sample_split",
]
