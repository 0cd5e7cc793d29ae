"""Search a sharded, mixed-generation gallery with the serving generation's queries.

``SearchRouter.search(queries (Q, D), k)`` searches every admitted shard's FAISS index along the
comparison path its generation needs (``orchestrator.comparison``):

- ``same``: the shard was embedded by the serving generation;
- ``direct``: an older generation in the same space, compatible by training (BCT, HBCT, …);
- ``adapter``: an older generation reached through backward adapters B (λ-orthogonality, the
  post-hoc maps), the queries being mapped once per generation, not once per shard; a spherical
  interpolation adapter (``slerp``) also takes the old generation's embeddings of the same queries
  (``RoutePlan.query_generations`` names the generations whose embeddings a search needs besides
  the serving one's; ``search(queries, k, queries_by_generation)`` takes them);
- ``forward``: an older generation reached through forward maps F (FCT): its stored index holds
  the old space, which the serving queries cannot search, so when the router is built the shard's
  stored embeddings (its Parquet file, checksum checked, or its rows' raw embeddings in a gallery
  store: ``stores.read_checked_embeddings``) are mapped by F into the serving space
  and put in an in-memory exact (``flat``) index of that space, whatever kind the stored index is
  (``paths()`` says so); the raw queries search it;

and merges the per-shard top-k lists into one global top-k (``merge_top_k``). Every index returns
distances of its space (``orchestrator.index``), so one sort ranks them all: the same rule as the
mixed-gallery evaluation, which ranks all items by their path's distance.

The router is three separate steps, each a function that a server whose shards live in other
processes calls too (``orchestrator.serving``): ``plan_routes`` (admission and comparison paths,
no index loaded), ``search_shards`` (the per-shard top-k lists of some of the routes) and
``search_merged`` (the queries in chunks, each chunk's per-shard lists merged by ``merge_top_k``).

Admission: a shard whose generation is not the serving one is searched only if the compatibility
criterion holds (``admission.CompatibilityCriterion``) and a comparison path exists. Otherwise
``on_incompatible="refuse"`` (the default) raises ``IncompatibleShards`` naming every such shard
and why, when the router is built, before any query; ``"skip"`` leaves those shards out and lists
them in ``SearchRouter.skipped`` and each ``SearchResult.skipped`` (an operator's explicit choice
to serve part of the gallery).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from orchestrator.comparison import ComparisonPath, IncomparableGenerations, comparison_path
from orchestrator.errors import UsageError
from orchestrator.gallery.shard_files import read_recorded_shard
from orchestrator.geometry.geometry import Geometry
from orchestrator.index import build_index
from orchestrator.lineage.records import ShardRecord
from orchestrator.models.bundle import CompatibleModel
from orchestrator.search.admission import CompatibilityCriterion

OnIncompatible = Literal["refuse", "skip"]
#: Queries per call of each shard index: at most this many, and few enough that the merge buffers
#: ((chunk, shards·k) distances, ids and sources, 24 bytes a slot) stay within MERGE_BUDGET_BYTES.
MAX_QUERY_CHUNK = 4096
MERGE_BUDGET_BYTES = 1 << 29
#: Rows of a forward-path shard mapped by F at once when its in-memory index is built.
MAP_GALLERY_CHUNK = 65536
#: What ``paths()`` adds for a generation whose shards are searched in an in-memory index.
IN_MEMORY_NOTE = "in-memory flat index of the mapped shard embeddings"


@dataclass(frozen=True)
class SkippedShard:
    """A shard the serving generation does not search, and why."""

    gallery: str
    index: int
    generation: str
    n_items: int
    reason: str

    def describe(self) -> str:
        return f"shard {self.index} ({self.n_items} items of {self.generation}): {self.reason}"


class IncompatibleShards(UsageError, ValueError):
    """The serving generation cannot search some shards; ``shards`` lists them with the reasons."""

    def __init__(self, serving: str, gallery: str, shards: Sequence[SkippedShard]):
        self.serving, self.gallery, self.shards = serving, gallery, list(shards)
        lines = "\n".join(f"  {s.describe()}" for s in self.shards)
        items = sum(s.n_items for s in self.shards)
        super().__init__(
            f"generation {serving!r} cannot search {len(self.shards)} shard(s) ({items} items) of gallery "
            f"{gallery!r}:\n{lines}\nBackfill them with {serving!r}, or search the rest explicitly "
            "(on_incompatible='skip', CLI --skip-incompatible).")


@dataclass(frozen=True)
class ShardRoute:
    """One admitted shard: its lineage row, how its generation is compared, and its index (the
    stored one, or on a ``forward`` path the in-memory flat index of the mapped embeddings)."""

    shard: ShardRecord
    path: ComparisonPath
    index: Any  # an orchestrator.index index: .dim, .ntotal, .search(queries, k)


def route_note(path: ComparisonPath) -> str:
    """How a generation's shards are searched along ``path`` (what ``paths()`` reports)."""
    return f"{path.note}; {IN_MEMORY_NOTE}" if path.maps_gallery else path.note


@dataclass(frozen=True)
class RoutePlan:
    """Which shards the serving generation searches and along which path, before any index is
    loaded (``plan_routes``): ``admitted`` (shard row, path) by shard index, ``skipped`` the rest."""

    serving: str
    gallery: str
    admitted: tuple[tuple[ShardRecord, ComparisonPath], ...]
    skipped: tuple[SkippedShard, ...]

    @property
    def searchable_items(self) -> int:
        return sum(int(shard.n_items) for shard, _path in self.admitted)

    def paths(self) -> dict[str, str]:
        """Generation → how its shards are searched (``same``, ``direct``, ``queries mapped by …``,
        ``gallery mapped by …; in-memory flat index …``)."""
        return {shard.generation: route_note(path) for shard, path in self.admitted}

    @property
    def query_generations(self) -> tuple[str, ...]:
        """The generations whose embeddings of the queries a search needs besides the serving
        generation's (the targets of the admitted paths' interpolating adapters), sorted; usually
        none."""
        return tuple(sorted({name for _shard, path in self.admitted for name in path.query_generations}))

    def result(self, distances: np.ndarray, ids: np.ndarray, shards: np.ndarray) -> "SearchResult":
        """The ``SearchResult`` of merged (Q, k) distances, ids and shard indexes over this plan."""
        return SearchResult(self.serving, ids, distances, shards,
                            {shard.index: shard.generation for shard, _path in self.admitted}, self.paths(),
                            list(self.skipped))


def plan_routes(serving: str, models: Mapping[str, CompatibleModel], parents: Mapping[str, str | None],
                shards: Sequence[ShardRecord], criterion: CompatibilityCriterion | None,
                on_incompatible: OnIncompatible = "refuse") -> RoutePlan:
    """Admission (``SearchRouter``'s arguments, module docstring): every non-empty shard admitted
    with its comparison path, or skipped with the reason; ``IncompatibleShards`` when a shard is
    skipped and ``on_incompatible == "refuse"``, or when none is admitted."""
    if on_incompatible not in ("refuse", "skip"):
        raise ValueError(f"on_incompatible must be 'refuse' or 'skip', got {on_incompatible!r}")
    shards = [s for s in shards if s.n_items and s.generation is not None]
    if not shards:
        raise ValueError("the gallery has no embedded shards to search")
    gallery = shards[0].gallery
    paths = {generation: _path(serving, generation, models, parents, criterion)
             for generation in sorted({s.generation for s in shards})}
    admitted, skipped = [], []
    for shard in sorted(shards, key=lambda s: s.index):
        path = paths[shard.generation]
        if isinstance(path, str):
            skipped.append(SkippedShard(shard.gallery, shard.index, shard.generation, int(shard.n_items), path))
        else:
            admitted.append((shard, path))
    if (skipped and on_incompatible == "refuse") or not admitted:
        raise IncompatibleShards(serving, gallery, skipped)
    return RoutePlan(serving, gallery, tuple(admitted), tuple(skipped))


def _path(serving: str, generation: str, models, parents, criterion: CompatibilityCriterion | None
          ) -> ComparisonPath | str:
    """The comparison path from ``serving``'s queries to ``generation``'s shards, or the reason
    they are not searched."""
    if criterion is not None:
        verdict = criterion.verdict(serving, generation)
        if not verdict.admitted:
            return verdict.reason
    try:
        return comparison_path(serving, generation, models, parents)
    except IncomparableGenerations as error:
        return error.reason


def load_route(shard: ShardRecord, path: ComparisonPath, load_index: Callable[[str], Any],
               read_embeddings: Callable[[ShardRecord], tuple[np.ndarray, np.ndarray]] | None = None) -> ShardRoute:
    """An admitted shard with its index: the stored one (``load_index(uri)``, its size checked
    against the lineage's row), or on a ``forward`` path the in-memory flat index of its stored
    embeddings (``read_embeddings``) mapped into the serving space."""
    if path.maps_gallery:
        return ShardRoute(shard, path, _mapped_index(shard, path, read_embeddings or _read_shard_file))
    if shard.index_uri is None:
        raise ValueError(f"gallery {shard.gallery!r} shard {shard.index} ({shard.generation}) has no index file "
                         "in the lineage")
    index = load_index(shard.index_uri)
    if int(index.ntotal) != int(shard.n_items):
        raise ValueError(f"gallery {shard.gallery!r} shard {shard.index} ({shard.generation}): its index "
                         f"{shard.index_uri} holds {index.ntotal} items, the lineage's shard "
                         f"{shard.n_items}; refusing to serve it (run `orchestrator verify FILE`)")
    return ShardRoute(shard, path, index)


def _mapped_index(shard: ShardRecord, path: ComparisonPath,
                  read_embeddings: Callable[[ShardRecord], tuple[np.ndarray, np.ndarray]]) -> Any:
    """The in-memory flat index, in ``path.space``, of the shard's stored embeddings (N, D_g)
    (``read_embeddings``: shard row → (ids (N,), embeddings)) mapped by ``path.map_gallery``
    (N, D_q), with the shard's item ids."""
    if shard.embeddings_uri is None:
        raise ValueError(f"gallery {shard.gallery!r} shard {shard.index} ({shard.generation}) has no embeddings "
                         f"file in the lineage; its {path.note} needs the stored embeddings")
    ids, embeddings = read_embeddings(shard)
    vectors = torch.from_numpy(np.ascontiguousarray(embeddings))
    mapped = torch.cat([path.map_gallery(part).float() for part in vectors.split(MAP_GALLERY_CHUNK)])
    geometry = Geometry(path.space, path.curv)
    return build_index(mapped.numpy(), geometry.space, "flat", ids, curv=geometry.curv)


@dataclass
class SearchResult:
    """The global top-k of each query.

    ids:        (Q, k) int64 item ids, −1 where fewer than k items were found.
    distances:  (Q, k) float64, ascending per row, +inf where no item.
    shards:     (Q, k) int64 shard index of each hit, −1 where no item.
    generation_of_shard: shard index → the generation whose embedding the shard holds.
    skipped:    shards that were not searched (``on_incompatible="skip"``).
    """

    serving: str
    ids: np.ndarray
    distances: np.ndarray
    shards: np.ndarray
    generation_of_shard: dict[int, str]
    paths: dict[str, str] = field(default_factory=dict)
    skipped: list[SkippedShard] = field(default_factory=list)

    def generations(self) -> np.ndarray:
        """(Q, k) object array: the generation of each hit's shard (None where no item)."""
        lookup = np.array([None] + [self.generation_of_shard.get(i) for i in range(max(self.generation_of_shard, default=-1) + 1)],
                          dtype=object)
        return lookup[self.shards + 1]

    def rows(self, attributes: Callable[[int, np.ndarray], Sequence[Mapping[str, Any]]] | None = None
             ) -> list[list[dict[str, Any]]]:
        """Per query, its hits as dicts (id, distance, shard, generation), missing slots dropped;
        with ``attributes`` ((shard index, its hits' ids (n,)) → per hit {"uri": …, metadata…}, in
        that order: ``search.attributes.ItemColumns.rows``) each hit also carries its item's source
        URI and metadata. Built from the (Q, k) arrays as Python lists, one lookup per shard."""
        ids, shards = self.ids.ravel(), self.shards.ravel()
        extra: list[Mapping[str, Any]] = [{}] * len(ids)
        if attributes is not None:
            for shard in np.unique(shards[shards >= 0]).tolist():
                positions = np.flatnonzero(shards == shard)
                for position, found in zip(positions.tolist(), attributes(shard, ids[positions])):
                    extra[position] = found
        generation = self.generation_of_shard
        width = self.ids.shape[1] if self.ids.ndim == 2 else 0
        out: list[list[dict[str, Any]]] = []
        hits = zip(ids.tolist(), self.distances.ravel().tolist(), shards.tolist(), extra)
        for _query in range(len(self.ids)):
            out.append([{"id": i, "distance": d, "shard": s, "generation": generation[s], **more}
                        for i, d, s, more in itertools.islice(hits, width) if i >= 0])
        return out


def _read_shard_file(shard: ShardRecord) -> tuple[np.ndarray, np.ndarray]:
    """(ids, embeddings) of the shard's Parquet file, its sha256 checked against the lineage row."""
    stored = read_recorded_shard(shard)
    return stored.ids, stored.embeddings


def merge_top_k(distances: Sequence[np.ndarray], ids: Sequence[np.ndarray], sources: Sequence[int],
                k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge per-shard results into the global top-k.

    distances[s], ids[s]: (Q, k_s) of shard ``sources[s]``, each row ascending (+inf / −1 = none).
    Returns (distances (Q, k), ids (Q, k), source (Q, k)): the k smallest distances of each row
    over all shards; ties broken by item id, so the result does not depend on the shard order.
    """
    if not distances:
        raise ValueError("merge_top_k: no shard results to merge")
    all_distances = np.concatenate(distances, axis=1)
    all_ids = np.concatenate(ids, axis=1)
    all_sources = np.concatenate([np.full(d.shape, s, dtype=np.int64) for d, s in zip(distances, sources)], axis=1)
    tie_break = np.where(all_ids < 0, np.iinfo(np.int64).max, all_ids)
    order = np.lexsort((tie_break, all_distances), axis=1)[:, :k]
    picked = [np.take_along_axis(a, order, axis=1) for a in (all_distances, all_ids, all_sources)]
    missing = picked[1] < 0
    picked[2][missing] = -1
    if picked[0].shape[1] < k:  # fewer candidates than k in total: pad
        pad = k - picked[0].shape[1]
        picked = [np.pad(a, ((0, 0), (0, pad)), constant_values=v) for a, v in zip(picked, (np.inf, -1, -1))]
    return picked[0], picked[1], picked[2]


#: Index kinds whose distances are the exact distance of the space (interchangeable in a merge).
EXACT_KINDS = ("flat", "ivf", "hnsw")


def check_one_distance_unit(gallery: str, kinds: Sequence[tuple[ShardRecord, str]]) -> None:
    """Refuse to merge shards whose indexes return distances in different units.

    kinds: (shard row, its index's kind) of every admitted shard. The exact kinds (``EXACT_KINDS``)
    all return the space's distance; every other kind (bit-plane Hamming, product quantisation) has
    units of its own, so a gallery must not mix it with another kind. This happens when
    ``gallery.index`` changes between generations of one lineage, or when a forward-path shard
    (searched in an exact in-memory index) meets compressed shards.
    """
    units: dict[str, list[str]] = {}
    for shard, kind in kinds:
        unit = "exact" if kind in EXACT_KINDS else kind
        units.setdefault(unit, []).append(f"shard {shard.index} ({shard.generation}, {kind})")
    if len(units) > 1:
        listing = "; ".join(", ".join(names) for names in units.values())
        raise ValueError(f"gallery {gallery!r}: its shard indexes return distances in different units and cannot be "
                         f"merged into one ranking: {listing}. Keep one gallery.index for the whole lineage "
                         "(re-embed the other shards with a full backfill to change it)")


@dataclass
class ShardHits:
    """Per-shard top-k lists of Q queries: ``distances[s]``, ``ids[s]`` (Q, k_s) of shard
    ``sources[s]``, each row ascending (+inf / −1 = none); what ``merge_top_k`` merges."""

    distances: list[np.ndarray] = field(default_factory=list)
    ids: list[np.ndarray] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)

    def extend(self, other: "ShardHits") -> None:
        self.distances += other.distances
        self.ids += other.ids
        self.sources += other.sources


#: Generation → (Q, D_generation) embeddings of the same Q queries by another generation than the
#: serving one, for the paths that interpolate with them (``RoutePlan.query_generations``).
QueriesByGeneration = Mapping[str, torch.Tensor]


def search_shards(routes: Sequence[ShardRoute], queries: torch.Tensor, k: int,
                  queries_by_generation: QueriesByGeneration | None = None) -> ShardHits:
    """The top-``k`` of each of the (Q, D) serving-generation ``queries`` in each route's index,
    the queries mapped along each route's path once per (generation, index width) (an
    interpolating path with ``queries_by_generation``, ``ComparisonPath.map_queries``)."""
    mapped: dict[tuple[str, int], np.ndarray] = {}
    hits = ShardHits()
    for route in routes:
        key = (route.shard.generation, int(route.index.dim))
        if key not in mapped:
            mapped[key] = route.path.map_queries(queries, key[1], queries_by_generation).double().numpy()
        found_distances, found_ids = route.index.search(mapped[key], min(k, max(route.index.ntotal, 1)))
        hits.distances.append(found_distances)
        hits.ids.append(found_ids)
        hits.sources.append(route.shard.index)
    return hits


def search_merged(queries: torch.Tensor | np.ndarray, k: int, n_routes: int,
                  search_chunk: Callable[[torch.Tensor, dict[str, torch.Tensor]], ShardHits],
                  queries_by_generation: Mapping[str, torch.Tensor | np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The global top-``k`` (distances, ids, shards; each (Q, k)) of the (Q, D) ``queries`` over
    ``n_routes`` shards: the queries in chunks small enough for the merge buffers, each chunk's
    per-shard lists (``search_chunk(chunk, the same rows of queries_by_generation)``:
    ``search_shards`` here or in the processes holding the shards) merged by ``merge_top_k``."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    queries = torch.as_tensor(queries)
    if queries.ndim != 2:
        raise ValueError(f"queries must be a (Q, D) matrix of serving-generation embeddings, got shape "
                         f"{tuple(queries.shape)}")
    others = {name: torch.as_tensor(found) for name, found in (queries_by_generation or {}).items()}
    chunk = max(1, min(MAX_QUERY_CHUNK, MERGE_BUDGET_BYTES // (24 * k * max(n_routes, 1))))
    parts = []
    for start in range(0, len(queries), chunk):
        hits = search_chunk(queries[start:start + chunk],
                            {name: found[start:start + chunk] for name, found in others.items()})
        parts.append(merge_top_k(hits.distances, hits.ids, hits.sources, k))
    if not parts:
        parts = [(np.zeros((0, k)), np.zeros((0, k), dtype=np.int64), np.zeros((0, k), dtype=np.int64))]
    distances, ids, shards = (np.concatenate([p[i] for p in parts]) for i in range(3))
    return distances, ids, shards


class SearchRouter:
    """Routes the serving generation's queries to every shard of one gallery (module docstring).

    serving:   the generation whose queries are searched (usually the deployed one).
    models:    generation name → model; needs ``serving``, every shard's generation and every
               generation on an adapter path (``comparison_path``).
    parents:   generation name → parent (None for roots).
    shards:    the gallery's shard rows (``LineageStore.shards``); empty shards are ignored.
    criterion: the compatibility criterion over recorded values (None: admit every shard that has
               a comparison path; for tests and galleries without recorded evaluations).
    load_index: index URI → index object (``orchestrator.index.load_index``).
    read_embeddings: shard row → (ids, its stored embeddings), for shards on a ``forward`` path
               (``stores.read_checked_embeddings``; default: its Parquet file, sha256 checked).
    """

    def __init__(self, serving: str, models: Mapping[str, CompatibleModel], parents: Mapping[str, str | None],
                 shards: Sequence[ShardRecord], criterion: CompatibilityCriterion | None,
                 load_index: Callable[[str], Any], on_incompatible: OnIncompatible = "refuse",
                 read_embeddings: Callable[[ShardRecord], tuple[np.ndarray, np.ndarray]] | None = None):
        self._load(plan_routes(serving, models, parents, shards, criterion, on_incompatible), models, load_index,
                   read_embeddings)

    @classmethod
    def of_plan(cls, plan: RoutePlan, models: Mapping[str, CompatibleModel], load_index: Callable[[str], Any],
                read_embeddings: Callable[[ShardRecord], tuple[np.ndarray, np.ndarray]] | None = None) -> "SearchRouter":
        """The router of a ``plan_routes`` plan: its admitted shards' indexes loaded."""
        router = cls.__new__(cls)
        router._load(plan, models, load_index, read_embeddings)
        return router

    def _load(self, plan: RoutePlan, models: Mapping[str, CompatibleModel], load_index: Callable[[str], Any],
              read_embeddings: Callable[[ShardRecord], tuple[np.ndarray, np.ndarray]] | None) -> None:
        self.plan, self.serving, self.models, self.gallery = plan, plan.serving, models, plan.gallery
        self.skipped: list[SkippedShard] = list(plan.skipped)
        self.routes: list[ShardRoute] = [load_route(shard, path, load_index, read_embeddings)
                                         for shard, path in plan.admitted]
        check_one_distance_unit(self.gallery, [(route.shard, route.index.kind) for route in self.routes])

    @property
    def model(self) -> CompatibleModel:
        """The serving generation's model (encodes the queries)."""
        return self.models[self.serving]

    @property
    def searchable_items(self) -> int:
        return self.plan.searchable_items

    def paths(self) -> dict[str, str]:
        """Generation → how its shards are searched (``RoutePlan.paths``)."""
        return self.plan.paths()

    @property
    def query_generations(self) -> tuple[str, ...]:
        """``RoutePlan.query_generations``: whose embeddings of the queries ``search`` needs too."""
        return self.plan.query_generations

    def search(self, queries: torch.Tensor | np.ndarray, k: int,
               queries_by_generation: Mapping[str, torch.Tensor | np.ndarray] | None = None) -> SearchResult:
        """Global top-``k`` of each of the (Q, D) serving-generation query embeddings;
        ``queries_by_generation``: the same queries embedded by each of ``query_generations``."""
        return self.plan.result(*search_merged(
            queries, k, len(self.routes), lambda chunk, others: search_shards(self.routes, chunk, k, others),
            queries_by_generation))
