"""The ``gallery`` section: the served gallery's items, shards, index and embedding resources."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator import limits
from orchestrator.config.problems import StrictModel, problem, raise_problems
from orchestrator.config.sources import source_name
from orchestrator.index.kinds import ALL_KINDS, BINARY_KINDS, HAMMING_KINDS, OPTIONS
from orchestrator.names import Name

#: The least items of a step whose Ray Data executor ``auto`` runs in a coordinator actor: below,
#: the executor costs the driver less (about 90 ms of CPU per second of a step that short) than
#: the coordinator's process alone (``EmbeddingSpec.executor``).
COORDINATOR_FROM_ITEMS = 100_000


class EmbeddingSpec(StrictModel):
    """How the gallery is (re-)embedded: the gallery step is one Ray Data pipeline (read tasks per
    shard update, the generation's actor pool, part writes; each update's files written by a
    finisher actor, committed by the driver as it completes).

    batch_size:  images per model call.
    concurrency: the embedding actor pool's size (its least size with ``max_concurrency``).
    max_concurrency: a pool that Ray Data grows with the work up to this many actors and shrinks
                 back (``ActorPoolStrategy(min_size=concurrency, max_size=max_concurrency)``).
    num_cpus / num_gpus: resources per embedding actor. With ``num_gpus`` the images are decoded
                 by CPU tasks before the model stage, so the GPU actors only run the model; the
                 index of each update is built by a finisher actor, never on one holding a GPU.
    rows_per_task: gallery rows one read task reads (default: 128 model batches, 32,768 rows at
                 batch 256; never more than a shard update holds). A task is one actor call and one
                 staged part while its rows stay under Ray Data's 128 MiB target block size, and
                 costs Ray Data's coordinator about 7 ms of CPU and the driver about 3 ms
                 (benchmarks/README.md, ``driver_rows.py``): a large cluster embedding a large
                 gallery wants larger tasks (and shards), so that neither bounds the step; smaller
                 tasks balance the actors better at the step's end.
    executor:    where Ray Data's executor runs (it dispatches the read tasks, waits on them and
                 polls their output): ``coordinator``, its coordinator actor on the driver's node,
                 so the driver only fetches part rows and commits; ``driver``, in the driver, with
                 no process of its own; ``auto`` (the default), the driver for a step of fewer than
                 100,000 items (``COORDINATOR_FROM_ITEMS``) and the coordinator from there. Measured
                 (benchmarks/README.md, ``driver_rows.py``): in the driver the executor costs it
                 about 6 ms of CPU per read task and 40-90 ms per second of the step, which at 10⁶
                 items is above 1 µs per item; in the coordinator the driver spends about 2.7 ms
                 per part row and 30 ms per second, but the coordinator is a process that starts
                 with the step (about 1.5-2.3 s of CPU, 0.6-1.2 s more to the first shard) and
                 spends more than the executor did in the driver, so a small step pays for it
                 without gaining.
    """

    batch_size: int = Field(256, ge=1, le=limits.MAX_BATCH_SIZE)
    concurrency: int = Field(1, ge=1, le=limits.MAX_WORKERS)
    max_concurrency: int | None = Field(None, ge=1, le=limits.MAX_WORKERS)
    num_cpus: float = Field(1.0, gt=0, le=limits.MAX_CPUS)
    num_gpus: float = Field(0.0, ge=0, le=limits.MAX_GPUS)
    rows_per_task: int | None = Field(None, ge=1, le=limits.MAX_ITEMS)
    executor: Literal["auto", "driver", "coordinator"] = "auto"

    @model_validator(mode="before")
    @classmethod
    def _removed_settings(cls, data: Any) -> Any:
        if isinstance(data, dict) and "writers" in data:
            raise_problems([problem(("writers",), "was removed: the gallery step runs on Ray Data, whose CPU tasks "
                                    "read, decode, stage and index without a pool of their own; size the model's "
                                    "actor pool with concurrency (and max_concurrency to autoscale)",
                                    data["writers"])])
        return data

    @model_validator(mode="after")
    def _pool(self) -> EmbeddingSpec:
        if self.max_concurrency is not None and self.max_concurrency < self.concurrency:
            raise_problems([problem(("max_concurrency",), f"at least concurrency ({self.concurrency})",
                                    self.max_concurrency)])
        return self

    @property
    def pool_size(self) -> tuple[int, int]:
        """(min, max) embedding actors."""
        return self.concurrency, self.max_concurrency or self.concurrency

    def executor_for(self, items: int) -> Literal["driver", "coordinator"]:
        """Where Ray Data's executor runs for a step of ``items`` items (``executor``)."""
        if self.executor != "auto":
            return self.executor
        return "coordinator" if items >= COORDINATOR_FROM_ITEMS else "driver"


STORE_KINDS = ("files", "pgvector", "lance")
#: The search index each store kind may build over its rows (``exact``: none, a scan).
STORE_INDEXES = {"files": ("exact",), "pgvector": ("exact", "hnsw", "ivfflat"), "lance": ("exact", "ivf_pq", "hnsw")}
#: The ``gallery.index`` kinds whose shards each store searches: the shard files every kind, the
#: other stores flat rows, pgvector also bit-plane codes (its ``bit`` type, Hamming distance).
STORE_GALLERY_INDEXES = {"files": ALL_KINDS, "pgvector": ("flat", *HAMMING_KINDS), "lance": ("flat",)}
#: The options of those indexes (checked by name here, by value when the store builds its index).
STORE_INDEX_OPTIONS = {"exact": (), "hnsw": ("m", "ef_construction", "ef_search"),
                       "ivfflat": ("lists", "probes"), "ivf_pq": ("num_partitions", "num_sub_vectors", "nprobes"),
                       }


class StoreSpec(StrictModel):
    """Where the gallery's searched vectors live (docs/stores.md).

    kind:      ``files`` (the default: a FAISS index file per shard beside its Parquet file, under
               the storage), ``pgvector`` (a PostgreSQL database with the ``vector`` extension) or
               ``lance`` (Lance datasets, embedded: a folder under the storage or ``path``).
    url:       ``pgvector`` only: the database, ``postgresql://user@host:port/db`` (a Unix socket:
               ``?host=/run/postgresql``); never a password in it (PGPASSWORD or ~/.pgpass, as for
               the lineage).
    table:     ``pgvector``: the prefix of the tables the store creates (one per generation,
               ``<table>__<generation>``); default ``orchestrator_<gallery>``.
    path:      ``lance``: the folder of its datasets (default ``<storage>/galleries/<gallery>/lance``).
    index:     the store's own search index over each generation's rows: ``exact`` (none: an
               exact scan, the same hits as the shard files), pgvector ``hnsw`` / ``ivfflat``,
               lance ``ivf_pq`` / ``hnsw``; approximate candidates are over-fetched and re-ranked
               exactly.
    index_options: that index's options (``hnsw``: m, ef_construction, ef_search; ``ivfflat``:
               lists, probes; ``ivf_pq``: num_partitions, num_sub_vectors, nprobes).
    overfetch: candidates fetched per requested hit and re-ranked with the exact distance.
    """

    kind: str = "files"
    url: str | None = None
    table: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_]{0,39}$")
    path: str | None = None
    index: str = "exact"
    index_options: dict[str, Any] = Field(default_factory=dict)
    overfetch: int = Field(4, ge=1, le=64)

    @model_validator(mode="after")
    def _check_store(self) -> StoreSpec:
        if self.kind not in STORE_KINDS:
            raise_problems([problem(("kind",), f"must be one of {', '.join(STORE_KINDS)}", self.kind)])
        if self.index not in STORE_INDEXES[self.kind]:
            raise_problems([problem(("index",), f"a {self.kind} store builds {', '.join(STORE_INDEXES[self.kind])}",
                                    self.index)])
        unknown = sorted(set(self.index_options) - set(STORE_INDEX_OPTIONS[self.index]))
        raise_problems([problem(("index_options", name), f"is not an option of index {self.index!r} (its options: "
                                f"{', '.join(STORE_INDEX_OPTIONS[self.index]) or 'none'})", self.index_options[name])
                        for name in unknown])
        if self.kind == "pgvector":
            from orchestrator.stores.locations import password_in_url, postgres_url_problem

            if self.url is None:
                raise_problems([problem(("url",), "a pgvector store needs the database's URL "
                                        "(postgresql://user@host:port/db)", None)])
            if password_in_url(self.url):
                raise_problems([problem(("url",), "never a password in the URL: give it in PGPASSWORD or ~/.pgpass",
                                        "***")])
            reason = postgres_url_problem(self.url)
            if reason:
                raise_problems([problem(("url",), reason, self.url)])
        elif self.url is not None:
            raise_problems([problem(("url",), f"only a pgvector store takes a url, this one is {self.kind}", self.url)])
        if self.kind != "pgvector" and self.table is not None:
            raise_problems([problem(("table",), "only a pgvector store has tables", self.table)])
        if self.kind != "lance" and self.path is not None:
            raise_problems([problem(("path",), "only a lance store takes a path", self.path)])
        return self


class GallerySpec(StrictModel):
    """The served gallery: which items, how many shards, which index per shard.

    name:             the gallery's name in the lineage, paths and reports (a safe path component).
    source / options: the gallery's own data source (e.g. CIFAR-10 for the open-set evaluation of
                      stationary_dsimplex.md §7.1); None uses ``data.source`` and ``data.options``.
                      Streamed sources, for galleries of any size (never loaded whole):
                      ``parquet_dataset`` (a Parquet file or a directory/prefix of many, local or
                      s3://: options path, image_column, id_column, uri_column, label_column,
                      metadata_columns, image_shape, storage_options) and ``image_files`` (image
                      files under a directory/prefix: options path, labels: folder).
    split:            the split of that source that forms the gallery (in-memory sources only).
    num_shards:       shards are the unit of backfill, lineage and indexing (initial count: an
                      item-level partial backfill moves its items into new shards); default 4.
    items_per_shard:  instead of num_shards: as many shards as this many items per shard need.
    index:            the index kind built per shard (``orchestrator.index.ALL_KINDS``): float
                      ``flat`` / ``ivf`` / ``hnsw``, bit-plane ``binary`` / ``binary_weighted`` /
                      ``binary_two_stage`` / ``binary_ivf``, or ``pq`` / ``opq`` / ``binary_opq``.
    index_options:    that kind's build options (``orchestrator.index.OPTIONS[index]``, e.g.
                      ``{bits: 2}``); names are checked here, values when the index is built.
    embedding:        batch size, workers and resources of the gallery step's shard updates.
    store:            where the searched vectors live (``StoreSpec``: the shard files by default,
                      or pgvector, or lance; docs/stores.md).
    """

    name: Name = "gallery"
    source: str | None = None
    options: dict[str, Any] | None = None
    split: str = "test"
    num_shards: int | None = Field(None, ge=1, le=limits.MAX_SHARDS)
    items_per_shard: int | None = Field(None, ge=1, le=limits.MAX_ITEMS)
    index: str = "flat"
    index_options: dict[str, Any] = Field(default_factory=dict)
    embedding: EmbeddingSpec = Field(default_factory=EmbeddingSpec)
    store: StoreSpec = Field(default_factory=StoreSpec)

    @model_validator(mode="after")
    def _check_store_index(self) -> GallerySpec:
        if self.index not in ALL_KINDS or self.index in STORE_GALLERY_INDEXES[self.store.kind]:
            return self  # (an unknown kind is named by _check_index)
        if self.store.kind == "lance" and self.index in BINARY_KINDS:
            reason = ("a lance store has no Hamming search of bit codes: binary kinds need store kind files or "
                      "pgvector (bit type, Hamming distance)")
        elif self.index == "binary_ivf":
            reason = ("binary_ivf is FAISS's IVF over the codes: with a pgvector store give binary or binary_weighted "
                      "and store.index ivfflat or hnsw (pgvector's own index over the bit column)")
        else:
            reason = (f"a {self.store.kind} store searches its own index (gallery.store.index: "
                      f"{', '.join(STORE_INDEXES[self.store.kind])}) over flat rows"
                      + (f" or bit codes ({', '.join(HAMMING_KINDS)})" if self.store.kind == "pgvector" else "")
                      + f"; {self.index!r} is searched in shard files only")
        raise_problems([problem(("index",), reason, self.index)])

    @model_validator(mode="after")
    def _check_index(self) -> GallerySpec:
        if self.index not in ALL_KINDS:
            raise_problems([problem(("index",), f"must be one of {', '.join(ALL_KINDS)}", self.index)])
        unknown = sorted(set(self.index_options) - set(OPTIONS[self.index]))
        raise_problems([problem(("index_options", name), f"is not an option of index {self.index!r} "
                                f"(its options: {', '.join(OPTIONS[self.index]) or 'none'})", self.index_options[name])
                         for name in unknown])
        raise_problems([problem(("index_options", name), f"at most {limits.MAX_INDEX_OPTIONS[name]} "
                                "(limits.MAX_INDEX_OPTIONS)", value)
                         for name, value in self.index_options.items() if name in limits.MAX_INDEX_OPTIONS
                         and isinstance(value, (int, float)) and value > limits.MAX_INDEX_OPTIONS[name]])
        return self

    @field_validator("source")
    @classmethod
    def _check_source(cls, source: str | None) -> str | None:
        return None if source is None else source_name(source, streamed=True)

    @model_validator(mode="after")
    def _one_shard_rule(self) -> GallerySpec:
        if self.num_shards is not None and self.items_per_shard is not None:
            raise_problems([problem(("items_per_shard",), "give num_shards or items_per_shard, not both",
                                    self.items_per_shard)])
        return self

    def shard_count(self, num_items: int) -> int:
        """The number of initial shards for a gallery of ``num_items`` items; ValueError naming
        ``gallery.items_per_shard`` when that would make more than ``limits.MAX_SHARDS``."""
        if self.items_per_shard is None:
            return 4 if self.num_shards is None else self.num_shards
        count = max(1, -(-num_items // self.items_per_shard))
        if count > limits.MAX_SHARDS:
            raise ValueError(f"gallery.items_per_shard: {self.items_per_shard} items per shard make {count} shards "
                             f"of the {num_items} gallery items, more than {limits.MAX_SHARDS} (limits.MAX_SHARDS)")
        return count
