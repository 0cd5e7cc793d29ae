"""The gallery step's embedding-actor work out of Ray, beside the plain loop's read and encoder.

    python benchmarks/stage_work.py [--items 131072] [--runs 9] [--json results/stage_work.json]

Both in this one process, with one torch thread, over the same generated cheap gallery
(``gallery_scale.generate_gallery``: 8×8 images) and generation (``gallery_scale.save_encoder``):

- ``plain``: the plain loop's read and encoder as ``gallery_scale.run_plain`` runs them, without
  its writer; ``plain_read``: its read alone;
- ``actor``: what an embedding actor of the gallery step does for each read task, without Ray:
  the task's blocks from ``gallery_read.entry_reader`` merged into one (``actor_read``, as Ray Data
  merges a read task's blocks below its target size), ``EmbedStage`` on it (``actor_embed``: the
  decoding, the model and the part's columns), ``parts.write_parts`` of its rows (``actor_stage``).

Each part's CPU per item (``time.process_time``: user + system) in each run, and their median and
range over the runs. The step's staged parts of the last run are checked against the plain loop's
embeddings of the same ids (``max_abs_difference``, 0 when both did the same work).
benchmarks/README.md ("The embedding actor's own work, out of Ray") has the figures and what they
say of the step's steady rate (issue 35).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python benchmarks/stage_work.py`: the checkout on the path, for `benchmarks.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa

from benchmarks.gallery_scale import ENCODERS, GENERATION, MEAN, STD, generate_gallery, plain_batches, save_encoder
from benchmarks.harness import write_results

SIDE = ENCODERS["cheap"]
PARTS = ("plain_read", "plain", "actor_read", "actor_embed", "actor_stage", "actor")


def plain_costs(gallery: Path, checkpoint: str, sha256: str,
                batch_size: int) -> tuple[dict[str, float], list[tuple[np.ndarray, np.ndarray]]]:
    """µs of CPU per item of the plain loop's read alone and of its read and encoder; and the
    (ids (B,), embeddings (B, D)) of its batches."""
    import torch

    from orchestrator.data.tensors import to_model_input
    from orchestrator.geometry.geometry import Geometry
    from orchestrator.methods.loading import load_generation

    model, _card = load_generation(checkpoint, expected_sha256=sha256)
    geometry = Geometry(model.space, model.curv)
    started, items = time.process_time(), 0
    for ids, _keys, _pixels in plain_batches(str(gallery), batch_size, SIDE):
        items += len(ids)
    read = time.process_time() - started
    embedded: list[tuple[np.ndarray, np.ndarray]] = []
    started = time.process_time()
    with torch.no_grad():
        for ids, _keys, pixels in plain_batches(str(gallery), batch_size, SIDE):
            embedding = model.encoder(to_model_input(pixels, SIDE, MEAN, STD)).embedding.float()
            geometry.uncertainty(embedding).numpy()
            embedded.append((ids, embedding.numpy()))
    whole = time.process_time() - started
    return {"plain_read": read / items * 1e6, "plain": whole / items * 1e6}, embedded


def actor_costs(gallery: Path, checkpoint: str, sha256: str, batch_size: int, items: int,
                staging: Path) -> dict[str, float]:
    """µs of CPU per item of an embedding actor's read, embedding and staging of every read task of
    one shard update holding the whole gallery; its parts are written under ``staging``."""
    from orchestrator.config.gallery import EmbeddingSpec
    from orchestrator.data.gallery_sources import ParquetDatasetSource
    from orchestrator.distributed.gallery_read import entry_reader, read_pieces
    from orchestrator.distributed.gallery_step import PART_BATCHES, EmbedStage, read_task_rows
    from orchestrator.distributed.generation_model import GenerationModel
    from orchestrator.shard_update.parts import write_parts
    from orchestrator.shard_update.update import ShardUpdate, UpdateKind

    source = ParquetDatasetSource(str(gallery), id_column="id", uri_column="key", image_shape=[SIDE, SIDE, 3])
    model = GenerationModel.from_checkpoint(GENERATION, checkpoint, sha256, SIDE, source.image_format, MEAN, STD)
    stage = EmbedStage(model, threads=1, decoded=False, batch_size=batch_size)
    block_rows = PART_BATCHES * batch_size
    pieces = read_pieces([ShardUpdate(UpdateKind.EMBED, 0, items, rows=(0, items))],
                         read_task_rows(EmbeddingSpec(batch_size=batch_size), block_rows))
    spent = dict.fromkeys(("actor_read", "actor_embed", "actor_stage"), 0.0)
    for piece in pieces:
        clock = time.process_time()
        block = pa.concat_tables(list(entry_reader(source, None, piece, block_rows)())).combine_chunks()
        spent["actor_read"] += time.process_time() - clock
        clock = time.process_time()
        rows = stage(block)
        spent["actor_embed"] += time.process_time() - clock
        clock = time.process_time()
        write_parts(rows, {0: str(staging)})
        spent["actor_stage"] += time.process_time() - clock
    costs = {name: seconds / items * 1e6 for name, seconds in spent.items()}
    return {**costs, "actor": sum(costs.values())}


def max_abs_difference(staging: Path, embedded: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """The largest |Δ| between the staged parts' embeddings and the plain loop's batches (``embedded``),
    item by item (inf when their ids differ)."""
    from orchestrator.shard_update.parts import read_parts

    parts = pa.concat_tables(read_parts([str(p) for p in sorted(staging.glob("*.arrow"))]))
    column = parts.column("embedding").combine_chunks()
    staged = column.values.to_numpy().reshape(len(parts), column.type.list_size)
    staged_ids = parts.column("id").to_numpy()
    plain_ids = np.concatenate([ids for ids, _ in embedded])
    plain = np.concatenate([rows for _, rows in embedded])
    if not np.array_equal(np.sort(staged_ids), np.sort(plain_ids)):
        return float("inf")
    return float(np.abs(staged[np.argsort(staged_ids)] - plain[np.argsort(plain_ids)]).max())


def summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per part: the median, least and most µs per item over the runs."""
    return {part: {"median": statistics.median(r[part] for r in runs), "min": min(r[part] for r in runs),
                   "max": max(r[part] for r in runs)} for part in PARTS}


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=131_072, help="items of the generated gallery")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workdir", type=Path, default=Path("runs/bench/stage_work"),
                        help="where the generated gallery is kept (reused) and the generation saved")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    gallery = generate_gallery(args.workdir / f"gallery-{args.items}", args.items)
    checkpoint = str(args.workdir / "generation")
    sha256 = save_encoder(checkpoint)
    runs: list[dict[str, float]] = []
    difference = float("nan")
    for run in range(args.runs):
        staging = Path(tempfile.mkdtemp(prefix="parts-", dir=args.workdir))
        try:
            plain, embedded = plain_costs(gallery, checkpoint, sha256, args.batch_size)
            runs.append({**plain, **actor_costs(gallery, checkpoint, sha256, args.batch_size, args.items, staging)})
            if run == args.runs - 1:
                difference = max_abs_difference(staging, embedded)
        finally:
            shutil.rmtree(staging)
        print(" ".join(f"{part} {runs[-1][part]:.2f}" for part in PARTS), "µs/item", flush=True)
    figures = summary(runs)
    for part, figure in figures.items():
        print(f"{part:12s} {figure['median']:6.2f} µs/item ({figure['min']:.2f}-{figure['max']:.2f})")
    print(f"staged embeddings vs the plain loop's: max |Δ| = {difference}")
    if args.json:
        document: dict[str, Any] = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                    "runs": runs, "summary": figures, "max_abs_difference": difference}
        write_results(args.json, document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
