"""Compatibility evaluation of trained generations on one query/gallery set.

Protocol (hbct.md §11): query set = gallery set = the evaluation split; every generation embeds
it once; for each pair (query generation t, gallery generation k ≤ t) retrieval ranks the gallery
by the gallery generation's distance, with the query's own item left out (leave-one-out by id).
Each pair is compared along ``orchestrator.comparison.comparison_path``: raw embeddings in a
shared space, queries mapped by backward adapters (λ-orthogonality, row B(φ_new)/φ_old), or the
older generation's gallery mapped by forward maps into the query's space (FCT, row F(φ_old)/φ_new).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from orchestrator.comparison import IncomparableGenerations, comparison_path
from orchestrator.methods.base import embed_dataset_with_ids
from orchestrator.metrics import retrieval_metrics, update_summary
from orchestrator.models.bundle import CompatibleModel


@dataclass
class CompatibilityReport:
    """Retrieval quality of every (query generation, gallery generation) pair.

    names:    generation names, oldest first.
    matrices: metric name (``metrics.METRICS``) → (T, T) array, row = query generation,
              column = gallery generation; NaN above the diagonal and for pairs with no common
              distance (different spaces or curvatures, no adapter).
    """

    names: list[str]
    matrices: dict[str, np.ndarray]
    notes: dict[tuple[str, str], str] = field(default_factory=dict)

    def value(self, query: str, gallery: str, metric: str = "cmc@1") -> float:
        return float(self.matrices[metric][self.names.index(query), self.names.index(gallery)])

    def compatibility(self, old: str, new: str, reference: str | None = None, metric: str = "cmc@1") -> dict[str, float | bool | None]:
        """``metrics.update_summary`` of the update old → new (self/cross values, the empirical
        criterion, and, given the unaligned ``reference`` φ_*, P_com and P_up), with the reference's
        self-test as ``reference_self``."""
        ref_self = None if reference is None else self.value(reference, reference, metric)
        summary = update_summary(self.value(new, new, metric), self.value(new, old, metric),
                                 self.value(old, old, metric), ref_self)
        if reference is not None:
            summary["reference_self"] = ref_self
        return summary

    def rows(self) -> list[dict[str, float | str]]:
        """One dict per evaluated pair (query, gallery, every metric), oldest query first."""
        out = []
        for t, query in enumerate(self.names):
            for k in range(t + 1):
                values = {metric: float(self.matrices[metric][t, k]) for metric in self.matrices}
                if all(math.isnan(v) for v in values.values()):
                    continue
                out.append({"query": query, "gallery": self.names[k], **values})
        return out

    def format_table(self) -> str:
        """A fixed-width text table of ``rows()``."""
        rows = self.rows()
        width = max([len("query → gallery")] + [len(f"{r['query']} → {r['gallery']}") for r in rows])
        metrics = list(self.matrices)
        header = f"{'query → gallery':<{width}}  " + "  ".join(f"{m:>7}" for m in metrics)
        lines = [header, "-" * len(header)]
        for r in rows:
            pair = f"{r['query']} → {r['gallery']}"
            lines.append(f"{pair:<{width}}  " + "  ".join(f"{r[m]:7.4f}" for m in metrics))
        return "\n".join(lines)


def evaluate_generations(
    models: Mapping[str, CompatibleModel],
    data: Dataset,
    parents: Mapping[str, str] | None = None,
    ks: Sequence[int] = (1, 5),
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> CompatibilityReport:
    """Fill the compatibility matrices of ``models`` (oldest first) on ``data``.

    data:    items ``(image, label, id)``; serves as both query and gallery set (leave-one-out).
    parents: generation name → parent name; used for the adapter path of λ-orthogonality and the
             forward path of FCT.
    """
    names = list(models)
    if not names:
        raise ValueError("evaluate_generations: no models given")
    parents = dict(parents or {})
    embedded = {}
    labels = ids = None
    for name, model in models.items():
        model.to(device)
        out, labels, ids = embed_dataset_with_ids(model, data, batch_size, device)
        embedded[name] = out.embedding.cpu()
    labels = labels.cpu()
    metric_names = [f"cmc@{k}" for k in ks] + ["map"]
    matrices = {metric: np.full((len(names), len(names)), np.nan) for metric in metric_names}
    notes: dict[tuple[str, str], str] = {}
    for t, query_name in enumerate(names):
        for k in range(t + 1):
            gallery_name = names[k]
            try:
                path = comparison_path(query_name, gallery_name, models, parents)
                queries, gallery = path.align(embedded[query_name], embedded[gallery_name])
            except IncomparableGenerations as reason:
                notes[(query_name, gallery_name)] = reason.reason
                continue
            if path.kind in ("adapter", "forward"):
                notes[(query_name, gallery_name)] = path.note
            result = retrieval_metrics(queries, gallery, labels, labels, path.space,
                                       curv=path.curv, ks=ks, query_ids=ids, gallery_ids=ids)
            for cmc_k, value in result.cmc.items():
                matrices[f"cmc@{cmc_k}"][t, k] = value
            matrices["map"][t, k] = result.mean_ap
    return CompatibilityReport(names, matrices, notes)

