"""Ray Data adapter: the gallery step's shard updates as one streaming Ray Data pipeline; workers
write every file, the driver receives metadata rows and commits.

The stages (each on Ray workers, streamed with Ray Data's backpressure):

1. **read**: ``gallery_read.gallery_dataset``, read tasks partitioned by shard update (every block
   holds rows of one update, tagged with its ``entry``), each reading its files a bounded block at a
   time; Ray Data merges the blocks of one task into one while they stay under its target block
   size (``DataContext.target_max_block_size``, 128 MiB), so a task of small images is one block;
2. **embed and stage**: ``map_batches(EmbedAndStage)`` on an actor pool holding the generation
   (``embedding.concurrency``, growing to ``max_concurrency``), one call per block: each actor
   embeds the block on slices of ``batch_size`` and writes its rows as one part file per update
   (``shard_update.parts``), passing on one row per part (entry, URI, count): these small rows are
   all that reaches the driver from the dataset. So a part is a read task's rows
   (``read_task_rows``: ``embedding.rows_per_task``, by default ``TASK_BLOCKS`` × ``PART_BATCHES``
   batches; fewer where the target block size splits them): about 2 parts per shard update of
   50,000 items, not one per batch, and the driver's work grows with the tasks
   (benchmarks/README.md, ``driver_rows.py``: a few ms of its CPU per task).
   With ``embedding.num_gpus`` the images are decoded first by CPU tasks (``decode_stage``) and
   the actors, on GPUs, only run the model and write the part;
3. **finish**: once the parts of an update hold all its items, the driver hands it to one of the
   step's finisher actors (``finish.Finisher`` running ``finish_task``), which reads them, writes the
   update's Parquet file and index (for a split, the source shard without the moved items too)
   and returns a ``ShardUpdateResult`` (URIs,
   sha256s, counts: about a kilobyte). The caller commits it as it comes.

Where Ray Data's executor runs (it dispatches every read task, waits on them and polls its
output): for a large step in its coordinator actor on the driver's node
(``Dataset.streaming_split(1)``, as Ray Train feeds its workers), so that the driver only fetches
part rows and commits; for a small one in the driver (``Dataset.iter_batches``), sparing the
coordinator's process. The rule and what each way costs (measured in benchmarks/README.md,
``driver_rows.py``, ``gallery_scale.py``) are ``EmbeddingSpec.executor`` and ``executor_for``.

Why the parts are staged by the actor that embedded them, and the read fused into that stage: a
stage of its own would be another pool of worker processes between the model and the files, and
move every image or embedding through the object store once more (measured once on 2 busy cores,
10⁵ items: the first part came 30 s after the start with separate read and staging stages, 14 s
with neither).

Why the finish is a call on an actor and not a ``Datasink`` or a ``groupby``: a Datasink's
``on_write_complete`` runs once, at the end of the whole write, which would lose the per-update
commit; ``groupby(update).map_groups`` shuffles every row before the first shard is written. Parts
let the first update commit as soon as its own rows are embedded.

Exactly once: part names are the hash of the rows they hold, inside a folder unique to the step's
attempt, so a part that Ray Data's retried actor call writes again is the same file, and an item
reported twice counts once (``assemble_shard``); the shard files keep their content-addressed names and the
first-attempt rule (``storage.overwrite``), applied by the finish call, which Ray does not retry:
a finish call lost with its actor is handed to ``on_lost``, which starts a new attempt of the step
(on a new actor).
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa

from orchestrator.config.gallery import EmbeddingSpec
from orchestrator.data.gallery_sources import GallerySource, ImageFormat, decode_images, raw_image_column
from orchestrator.distributed.data_settings import data_settings
from orchestrator.distributed.finish import Finishes
from orchestrator.distributed.gallery_read import gallery_dataset
from orchestrator.distributed.generation_model import GenerationModel
from orchestrator.distributed.task_errors import raised_error
from orchestrator.gc_startup import startup_phase
from orchestrator.shard_update import ShardTarget, ShardUpdate, ShardUpdateResult, embedded_part
from orchestrator.shard_update.parts import staging_folder, write_parts

PART_BATCHES = 8  # embedding batches per block a read task reads (and per call of a GPU actor)
TASK_BLOCKS = 16  # blocks per read task by default (32,768 rows at batch 256; embedding.rows_per_task)


class EmbedStage:
    """Ray Data callable class: a batch of items (``gallery_read`` columns) → ``embedded_part``
    rows (the batch without ``image``, with ``embedding`` and ``uncertainty``), the model called on
    slices of ``batch_size`` items. Loads the generation once per actor, on its GPU when Ray gave
    it one. ``decoded``: the ``image`` column already holds raw pixels at the model's size
    (``decode_stage`` ran before)."""

    def __init__(self, model: GenerationModel, threads: int, decoded: bool, batch_size: int):
        with startup_phase():  # torch, timm and the checkpoint's load (gc_startup)
            import torch

            torch.set_num_threads(max(1, threads))
            self.embedder = model.embedder("cuda" if torch.cuda.is_available() else "cpu")
        self.size, self.batch_size = model.image_size, batch_size
        self.image_format = ImageFormat("raw", (self.size, self.size, 3)) if decoded else model.image_format

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.concat_tables([self._embedded(batch.slice(start, self.batch_size))
                                 for start in range(0, len(batch), self.batch_size)])

    def _embedded(self, batch: pa.Table) -> pa.Table:
        return embedded_part(batch, *self.embedder(decode_images(batch.column("image"), self.image_format, self.size)))


class EmbedAndStage(EmbedStage):
    """The step's embedding stage: a batch embedded (``EmbedStage``) and its rows staged as one part
    file per update (``shard_update.parts.write_parts``) by the same actor, which passes on only
    one row per part (``entry``, ``uri``, ``n_items``). Staging in the actor that embedded the rows
    spares a stage of its own: no embedding leaves the process that computed it but in a file."""

    def __init__(self, model: GenerationModel, threads: int, decoded: bool, batch_size: int,
                 folders: dict[int, str], storage_options: dict | None):
        super().__init__(model, threads, decoded, batch_size)
        self.folders, self.storage_options = folders, storage_options

    def __call__(self, batch: pa.Table) -> pa.Table:
        return write_parts(super().__call__(batch), self.folders, self.storage_options)


def decode_stage(batch: pa.Table, image_format: ImageFormat, image_size: int) -> pa.Table:
    """CPU tasks before a GPU model stage: the ``image`` column decoded to raw uint8 pixels at
    (image_size, image_size, 3), so the GPU actors only run the model."""
    pixels = decode_images(batch.column("image"), image_format, image_size)
    return batch.set_column(batch.schema.get_field_index("image"), "image", raw_image_column(pixels))


def embedded_dataset(dataset, image_format: ImageFormat, model: GenerationModel, resources: EmbeddingSpec,
                     max_actors: int, staging: tuple[dict[int, str], dict | None] | None = None):
    """Stage 2 over a dataset of items (``gallery_read`` columns): decode (CPU tasks, with GPUs)
    and the generation's actor pool, at most ``max_actors`` actors → ``embedded_part`` rows; with
    ``staging`` (each entry's part folder, the storage options) the actors stage them
    (``EmbedAndStage``) and pass on one row per part. The first stage takes whole blocks (no
    ``batch_size`` for Ray Data, which then fuses the read into it: its workers read their own
    items); GPU actors (Ray Data wants a batch size there) take ``PART_BATCHES`` model batches a
    call. The model runs on slices of ``batch_size``."""
    from ray.data import ActorPoolStrategy

    low, high = resources.pool_size
    decoded = bool(resources.num_gpus)
    if decoded:
        dataset = dataset.map_batches(decode_stage, fn_kwargs={"image_format": image_format,
                                                               "image_size": model.image_size},
                                      batch_size=None, batch_format="pyarrow", num_cpus=1)
    stage, arguments = EmbedStage, {"model": model, "threads": int(resources.num_cpus), "decoded": decoded,
                                    "batch_size": resources.batch_size}
    if staging is not None:
        stage, arguments = EmbedAndStage, {**arguments, "folders": staging[0], "storage_options": staging[1]}
    return dataset.map_batches(stage, fn_constructor_kwargs=arguments,
                               compute=ActorPoolStrategy(min_size=min(low, max_actors),
                                                         max_size=max(1, min(high, max_actors))),
                               batch_size=PART_BATCHES * resources.batch_size if decoded else None,
                               batch_format="pyarrow", num_cpus=resources.num_cpus,
                               num_gpus=resources.num_gpus or None)


def embed_gallery(source: GallerySource, updates: Sequence[ShardUpdate], model: GenerationModel,
                  resources: EmbeddingSpec | None = None, block_rows: int | None = None,
                  rows_per_task: int | None = None, max_actors: int | None = None,
                  staging: tuple[dict[int, str], dict | None] | None = None):
    """A lazy ``ray.data.Dataset`` of the items that ``updates`` read embedded by ``model`` (stages 1
    and 2: the rows the step stages, with their ``entry``: the update's position; with ``staging``,
    the part rows), for
    consumers of the embeddings themselves (the re-embedding benchmarks). Ray must be initialised.

    block_rows:    rows per block a read task reads and yields (default ``PART_BATCHES`` batches);
                   Ray Data merges a task's blocks below its target block size (module docstring);
    rows_per_task: rows per read task (default ``read_task_rows(resources, block_rows)``);
    max_actors:    no larger an actor pool than this (the step: its number of updates).
    """
    resources = resources if resources is not None else EmbeddingSpec()
    block_rows = block_rows or PART_BATCHES * resources.batch_size
    high = min(resources.pool_size[1], max_actors or resources.pool_size[1])
    dataset = gallery_dataset(source, updates, block_rows=block_rows,
                              rows_per_task=rows_per_task or read_task_rows(resources, block_rows))
    return embedded_dataset(dataset, source.image_format, model, resources, max_actors=high, staging=staging)


def read_task_rows(resources: EmbeddingSpec, block_rows: int) -> int:
    """Rows per read task: ``embedding.rows_per_task``, else ``TASK_BLOCKS`` blocks of
    ``block_rows`` (few tasks: Ray Data's coordinator spends about 7 ms of CPU on each, the driver
    about 3 ms)."""
    return resources.rows_per_task or TASK_BLOCKS * block_rows


def step_dataset(source: GallerySource, updates: Sequence[ShardUpdate], model: GenerationModel,
                 target: ShardTarget, resources: EmbeddingSpec, attempt_token: str):
    """The step's lazy ``ray.data.Dataset`` (module docstring, stages 1 and 2): one row per staged
    part (``entry``, ``uri``, ``n_items``). Ray must be initialised."""
    folders = {entry: staging_folder(target.gallery_root, update.key, attempt_token)
               for entry, update in enumerate(updates)}
    return embed_gallery(source, updates, model, resources, max_actors=len(updates),
                         staging=(folders, target.storage_options))


def finisher_actors(resources: EmbeddingSpec) -> int:
    """Finisher actors (which ask Ray for no CPU) of a step: as many as the embedding actors can
    grow to. A finish costs a small share of the embedding of its items (benchmarks/README.md,
    ``gallery_scale``: 7.5-8.3 s of finishes for 10⁶ items that two actors embedded in 29-105 s), so
    one finisher keeps up with one actor, and each more is a Python interpreter importing torch,
    pyarrow and FAISS (about 3 s of a core) that a one-actor step would leave idle."""
    return resources.pool_size[1]


#: Ray Data's settings while a step runs (``data_settings``, put back after it): no per-dataset
#: progress bars or INFO lines (the pipeline prints its own progress: one line per committed
#: shard), and a stage's error raised as the stage raised it, not wrapped in a ``UserCodeException``
#: (whose cause would not survive the trip through the coordinator actor;
#: ``task_errors.raised_error`` unwraps Ray's own wrappers).
STEP_SETTINGS = {"enable_progress_bars": False, "raise_original_map_exception": True}


def run_shard_updates(source: GallerySource, updates: Sequence[ShardUpdate], model: GenerationModel,
                      target: ShardTarget, resources: EmbeddingSpec,
                      on_lost: Callable[[ShardUpdate, BaseException], ShardUpdate | None],
                      on_staged: Callable[[int], None] = lambda n_items: None) -> Iterator[ShardUpdateResult]:
    """Run every started update of ``source``'s items through the step's stages; yield each
    update's result as its finish call completes (any order). Ray must be initialised. A finish
    call lost with its actor: ``on_lost(update, error)`` returns the update to finish again (from
    the same parts), or None to raise the error. ``on_staged(n_items)``: a part of that many
    embedded items was staged (progress before the first update completes). An error of an update
    itself (an undecodable image, items not as planned, a file the lineage does not know) is raised
    as raised on the worker."""
    if not updates:
        return
    by_entry = dict(enumerate(updates))
    finishes = Finishes(model, target, min(finisher_actors(resources), len(updates)), on_lost)
    parts: dict[int, dict[str, int]] = {entry: {} for entry in by_entry}
    try:
        with data_settings(**STEP_SETTINGS):  # while its Dataset runs
            dataset = step_dataset(source, updates, model, target, resources, uuid.uuid4().hex[:12])
            for batch in _batches(dataset, resources.executor_for(sum(u.num_items for u in updates))):
                for entry, uri, n_items in zip(*(batch.column(c).to_pylist() for c in ("entry", "uri", "n_items"))):
                    if uri not in parts[entry]:
                        parts[entry][uri] = n_items
                        on_staged(n_items)
                        if sum(parts[entry].values()) == by_entry[entry].num_items:
                            finishes.add(by_entry[entry], sorted(parts[entry]))
                yield from finishes.completed(timeout=0)
        for entry, update in by_entry.items():
            staged = sum(parts[entry].values())
            if staged != update.num_items:
                raise RuntimeError(f"{update.key}: the step's stages staged {staged} items, the plan says "
                                   f"{update.num_items}")
        while finishes:
            yield from finishes.completed(timeout=None)
    finally:
        finishes.close()


def _batches(dataset, executor: str) -> Iterator[pa.Table]:
    """The dataset's metadata rows as they stream out; a stage's own error re-raised as the worker
    raised it (an undecodable image: its ValueError), not wrapped in Ray's.

    ``executor`` "coordinator": the dataset runs in Ray Data's coordinator actor
    (``streaming_split(1)``, the way Ray Train feeds its workers): Ray Data's executor (dispatching
    read tasks, waiting on them, its 10 ms output poll) takes a core of its own, and the driver only
    fetches each part row and commits; "driver": it runs here (``iter_batches``), with no process
    of its own (benchmarks/README.md, ``driver_rows.py``: the driver's CPU per part row and per
    second of step, either way)."""
    rows = dataset.streaming_split(1)[0] if executor == "coordinator" else dataset
    try:
        yield from rows.iter_batches(batch_size=None, batch_format="pyarrow")
    except Exception as failed:
        cause = raised_error(failed)
        if cause is failed:
            raise
        raise cause from failed
