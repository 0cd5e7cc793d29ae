"""Compatibility evaluation of trained generations on one query/gallery set.

Protocol (hbct.md §11): query set = gallery set = the evaluation split; every generation embeds
it once; for each pair (query generation t, gallery generation k ≤ t) retrieval ranks the gallery
by the gallery generation's distance, with the query's own item left out (leave-one-out by id).
Each pair is compared along ``orchestrator.comparison.comparison_path``: raw embeddings in a
shared space, queries mapped by backward adapters (λ-orthogonality, row B(φ_new)/φ_old), or the
older generation's gallery mapped by forward maps into the query's space (FCT, row F(φ_old)/φ_new).

Two stages: ``embed_split`` (one pass of one model over the split) and ``compare_generations``
(every cell from stored embeddings only; the models supply spaces and adapters, nothing is
embedded), so a lineage embeds each generation once however many later generations compare
against it (the pipeline stores them: ``orchestrator.pipeline.evaluate_step``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from orchestrator.comparison import IncomparableGenerations, comparison_path
from orchestrator.data import LabeledImages, stratified_sample
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

    def update_summary(self, old: str, new: str, metric: str, reference: str | None = None,
                       reference_self: float | None = None) -> dict[str, float | bool | None]:
        """``metrics.update_summary`` of the update old → new on ``metric`` from this report's cells
        (self/cross values, the empirical criterion and, given the unaligned φ_*, P_com and P_up).
        φ_*'s self-test is the cell of the generation ``reference`` of this report, or a
        ``reference_self`` measured elsewhere (a sweep's trial); a NaN one counts as none."""
        if reference is not None:
            reference_self = self.value(reference, reference, metric)
        if reference_self is not None and math.isnan(reference_self):
            reference_self = None
        return update_summary(self.value(new, new, metric), self.value(new, old, metric),
                              self.value(old, old, metric), reference_self)

    def compatibility(self, old: str, new: str, reference: str | None = None, metric: str = "cmc@1") -> dict[str, float | bool | None]:
        """``update_summary`` of the update old → new, with the ``reference``'s self-test as
        ``reference_self``."""
        summary = self.update_summary(old, new, metric, reference)
        if reference is not None:
            summary["reference_self"] = self.value(reference, reference, metric)
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


@dataclass(frozen=True)
class SplitEmbeddings:
    """One generation's embeddings of the evaluation split, all on the CPU.

    embedding: (N, D) float; labels: (N,) int64; ids: (N,) int64 (item ids, for leave-one-out).
    """

    embedding: torch.Tensor
    labels: torch.Tensor
    ids: torch.Tensor

    def __post_init__(self) -> None:
        n = self.embedding.shape[0]
        if self.embedding.ndim != 2 or self.labels.shape != (n,) or self.ids.shape != (n,):
            raise ValueError(f"SplitEmbeddings: expected embedding (N, D), labels (N,) and ids (N,), got "
                             f"{tuple(self.embedding.shape)}, {tuple(self.labels.shape)}, {tuple(self.ids.shape)}")


def sample_split(images: LabeledImages, max_items: int | None, seed: int = 0) -> LabeledImages:
    """A seeded class-stratified sample of ``max_items`` of ``images`` (``stratified_sample``: each
    class keeps its share within one item), in split order; the whole split when ``max_items`` is
    None or not smaller than it."""
    if max_items is None or len(images) <= max_items:
        return images
    return images.subset(stratified_sample(images.labels, max_items / len(images), seed))


def embed_split(model: CompatibleModel, data: Dataset, batch_size: int = 256,
                device: torch.device | str = "cpu") -> SplitEmbeddings:
    """``model``'s embeddings of ``data`` (items ``(image, label, id)``), one pass over it."""
    model.to(device)
    out, labels, ids = embed_dataset_with_ids(model, data, batch_size, device)
    return SplitEmbeddings(out.embedding.cpu(), labels.cpu(), ids.cpu())


def compare_generations(
    models: Mapping[str, CompatibleModel],
    embedded: Mapping[str, SplitEmbeddings],
    parents: Mapping[str, str] | None = None,
    ks: Sequence[int] = (1, 5),
    queries: Sequence[str] | None = None,
) -> CompatibilityReport:
    """The compatibility matrices of ``models`` (oldest first) from stored embeddings only.

    embedded: generation name → its ``SplitEmbeddings`` of one split (same items, same order);
              needed for every generation whose row or column is computed.
    parents:  generation name → parent name; used for the adapter path of λ-orthogonality and the
              forward path of FCT (``models`` supplies the adapters and spaces; nothing is embedded).
              A spherical interpolation path (``slerp``) takes the parent's embeddings of the same
              items as the parent's query embeddings, as the router takes them for a query.
    queries:  the query generations whose rows are computed (default: all); every gallery
              generation k ≤ t of such a row t is compared.
    """
    names = list(models)
    if not names:
        raise ValueError("compare_generations: no models given")
    parents = dict(parents or {})
    rows = names if queries is None else list(queries)
    unknown = [name for name in rows if name not in models]
    if unknown:
        raise ValueError(f"compare_generations: query generation(s) {', '.join(unknown)} not among the models")
    needed = {gallery for query in rows for gallery in names[: names.index(query) + 1]}
    labels, ids = _common_items(embedded, needed)
    metric_names = [f"cmc@{k}" for k in ks] + ["map"]
    matrices = {metric: np.full((len(names), len(names)), np.nan) for metric in metric_names}
    notes: dict[tuple[str, str], str] = {}
    for query_name in rows:
        t = names.index(query_name)
        for k in range(t + 1):
            gallery_name = names[k]
            try:
                path = comparison_path(query_name, gallery_name, models, parents)
                aligned = path.align(embedded[query_name].embedding, embedded[gallery_name].embedding,
                                     {name: embedded[name].embedding for name in path.query_generations
                                      if name in embedded})
            except IncomparableGenerations as reason:
                notes[(query_name, gallery_name)] = reason.reason
                continue
            if path.kind in ("adapter", "forward"):
                notes[(query_name, gallery_name)] = path.note
            result = retrieval_metrics(*aligned, labels, labels, path.space,
                                       curv=path.curv, ks=ks, query_ids=ids, gallery_ids=ids)
            for cmc_k, value in result.cmc.items():
                matrices[f"cmc@{cmc_k}"][t, k] = value
            matrices["map"][t, k] = result.mean_ap
    return CompatibilityReport(names, matrices, notes)


def _common_items(embedded: Mapping[str, SplitEmbeddings], names: set[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels, ids) shared by the embeddings of ``names``; ValueError when one is missing or
    embeds other items (another split, sample or order)."""
    missing = sorted(name for name in names if name not in embedded)
    if missing:
        raise ValueError(f"compare_generations: no embeddings given for generation(s) {', '.join(missing)}")
    first = embedded[min(names)]
    for name in sorted(names):
        other = embedded[name]
        if not (torch.equal(other.ids, first.ids) and torch.equal(other.labels, first.labels)):
            raise ValueError(f"compare_generations: generation {name!r}'s embeddings cover other items "
                             f"than generation {min(names)!r}'s (another split or sample)")
    return first.labels, first.ids


def evaluate_generations(
    models: Mapping[str, CompatibleModel],
    data: Dataset,
    parents: Mapping[str, str] | None = None,
    ks: Sequence[int] = (1, 5),
    batch_size: int = 256,
    device: torch.device | str = "cpu",
) -> CompatibilityReport:
    """Fill the compatibility matrices of ``models`` (oldest first) on ``data``: each generation
    embeds it once (``embed_split``), then ``compare_generations``.

    data:    items ``(image, label, id)``; serves as both query and gallery set (leave-one-out).
    parents: generation name → parent name; used for the adapter path of λ-orthogonality and the
             forward path of FCT.
    """
    if not models:
        raise ValueError("evaluate_generations: no models given")
    embedded = {name: embed_split(model, data, batch_size, device) for name, model in models.items()}
    return compare_generations(models, embedded, parents, ks)
