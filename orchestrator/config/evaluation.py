"""The ``evaluation`` and ``search`` sections: how generations are compared and the served
gallery's search is scored."""
from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from orchestrator import limits
from orchestrator.config.problems import StrictModel
from orchestrator.metrics import METRICS


class EvaluationSpec(StrictModel):
    """How generations are compared (hbct.md §11).

    reference: the unaligned model φ_* (a generation with no parent, never deployed) that P_com and
               P_up normalise by; None reports self / cross retrieval and the compatibility matrix
               only. The metrics are fixed: ``METRICS`` = CMC@1, CMC@5, mAP.
    backfill_curves: after each update, also trace the backfilling curve (retrieval quality of
               the served gallery versus the fraction re-embedded in the policy's order,
               λ-orthogonality §2.11) as CSV + PNG; costs one embedding of the whole gallery by
               the new generation, so it is for evaluation runs, not production galleries.
    gallery_sample: the served-gallery report (``gallery-eval``) scores a seeded uniform sample of
               at most this many labelled gallery items (the whole gallery when smaller): each
               stored shard is read and cut to the sample, and the sample is embedded once by the
               serving generation. The router's search row and the backfilling curve need the
               whole gallery. A gallery without labels is not scored (the step says so).
    eval_sample: the compatibility matrices (``evaluate:<gen>``) are measured on a seeded
               class-stratified sample of at most this many items of the evaluation split (the
               whole split when smaller, or when null); each generation embeds it once and its
               embeddings are stored and reused by every later generation's evaluation.
    warn_p_up: after each evaluation, a generation with a parent whose P_up on mAP (its own
               self-test against the reference's, hbct.md eq. 15) is below this is named in a
               warning line: the compatibility training costs it that share of the quality the
               same training reaches unaligned. None: no warning; needs ``reference``.
    """

    reference: str | None = None
    backfill_curves: bool = False
    gallery_sample: int = Field(10_000, ge=10, le=limits.MAX_ITEMS)
    eval_sample: int | None = Field(10_000, ge=10, le=limits.MAX_ITEMS)
    warn_p_up: float | None = Field(-0.2, ge=-1.0, le=0.0)

    metrics: ClassVar[tuple[str, ...]] = METRICS


class SearchSpec(StrictModel):
    """How the served gallery is searched (``orchestrator.search``) and how that search is scored.

    criterion_metric: the recorded metric of the compatibility criterion M(new→old) > M(old→old)
                      that admits an older generation's shards for the serving generation's queries.
    eval_k:           depth of the pipeline's search evaluation (the router's real top-k through
                      the shard indexes); None: the whole gallery, so its mAP is the full-ranking
                      mAP and equals the exact mixed-gallery number for flat indexes.
    """

    criterion_metric: Literal[METRICS] = "map"  # type: ignore[valid-type]
    eval_k: int | None = Field(None, ge=5, le=limits.MAX_TOP_K)
