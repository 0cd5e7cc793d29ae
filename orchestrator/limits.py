"""Upper bounds on what a configuration file may ask for, in one place.

A small file must not be able to exhaust the machine that reads it: every YAML file is read within
the ``YAML_*`` bounds (``orchestrator.bounded_yaml``), and every count-like field of the typed
configs (pipeline, tune file, method parameters, training settings) has an upper bound from here.
The bounds are far above any real use (a value near one is already a very large run) and far
below what makes a step allocate without end; raise one here, with a reason, if a real run needs it.

Decisions:
- YAML is parsed by pure-Python PyYAML (its C parser cannot be bounded while composing), about
  20,000 nodes or 1 MiB a second on a busy core: the YAML bounds keep the worst file under a second.
- YAML bounds count the document as constructed: an alias (``*a``) counts every node of what it
  stands for, so ten lines of nested aliases ("billion laughs") are refused before anything is
  built, and nesting counts through aliases too.
- Counts of things that are each cheap (shards, items per shard, samples) get generous bounds;
  counts that multiply work or memory directly (workers, actors, epochs, batch sizes) smaller ones.
"""
from __future__ import annotations

# --- YAML files ------------------------------------------------------------------------------
YAML_MAX_BYTES = 256 << 10        # file size; the repository's pipeline files are at most 6 KiB
YAML_MAX_NODES = 10_000           # nodes with every alias expanded; its files have at most 500
YAML_MAX_ALIASES = 1_000          # alias uses (*name) in one document
YAML_MAX_DEPTH = 50               # nesting of mappings / sequences, through aliases too
YAML_MAX_SCALAR_CHARS = 65_536    # one scalar (a description, a path, a number)
YAML_MAX_INT_DIGITS = 30          # an integer scalar (a 64-bit seed has 20 digits)

# --- names -----------------------------------------------------------------------------------
NAME_MAX_LENGTH = 64              # a configured name is one path component (orchestrator.names)

# --- pipeline counts -------------------------------------------------------------------------
MAX_GENERATIONS = 1_000           # generations of one pipeline
MAX_SHARDS = 100_000              # gallery shards (num_shards, and the count items_per_shard implies)
MAX_ITEMS = 1_000_000_000         # items: per shard, per class, of a sampled evaluation
MAX_WORKERS = 16_384              # Ray Train workers, embedding actors, concurrent trials (100 nodes of 64 cores: 6,400)
MAX_CPUS = 1_024.0                # CPUs asked for one worker / actor / trial
MAX_GPUS = 64.0                   # GPUs asked for one worker / actor / trial
MAX_FAILURES = 1_000              # retries of a failed training run or trial
MAX_CHECKPOINTS_TO_KEEP = 1_000   # Ray Train epoch checkpoints kept
MAX_CONNECT_TIMEOUT_S = 3_600     # seconds a command waits for a Ray address or an S3 endpoint to answer
MAX_EPOCHS = 100_000              # training epochs (also a method's adapter / inner epochs)
MAX_BATCH_SIZE = 1_048_576        # items per batch (training, embedding, a method's inner batches)
MAX_IMAGE_SIZE = 4_096            # pixels per side of an image
MAX_EMBED_DIM = 65_536            # embedding / hidden width
MAX_CHANNELS = 64                 # input channels of an image
MAX_CLASSES = 1_000_000           # class ids, tasks, prototypes, per-class counts
MAX_TOP_K = 1_000_000             # search depth (eval_k, a method's neighbours)
MAX_STEPS = 1_000_000             # inner optimisation steps / pairs of a method

#: index build options that are counts (gallery.index_options; their other checks are the index's)
MAX_INDEX_OPTIONS = {
    "nlist": MAX_TOP_K, "nprobe": MAX_TOP_K, "hnsw_m": 1_024, "ef_construction": MAX_TOP_K,
    "ef_search": MAX_TOP_K, "refine_factor": 1_000, "rerank_factor": 1_000, "pq_m": MAX_EMBED_DIM,
    "pq_nbits": 16, "train_size": MAX_ITEMS,
}

# --- tuning ----------------------------------------------------------------------------------
MAX_NUM_SAMPLES = 100_000         # trials (or grid repeats) of one sweep
MAX_GRACE_PERIOD = MAX_EPOCHS     # ASHA grace period, in epochs
MAX_SPACE_VALUES = 10_000         # values of one grid / choice entry
