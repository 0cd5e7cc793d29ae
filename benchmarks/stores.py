"""Gallery stores side by side (shard files, pgvector, Lance): backfill items/s, query QPS and latency, recall@10, disk.

The measurement lives in ``orchestrator.benchmarks.stores``; its docstring and benchmarks/README.md
say what is measured and how to run it. One thread: the thread-count variables default to 1 here,
before numpy and faiss load."""
import os
import sys

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

from orchestrator.benchmarks.stores import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
