"""Load on ``orchestrator serve`` against the router in one process, at 10⁵ and 10⁶ items, in one run.

The measurement lives in ``orchestrator.benchmarks.serve_load``; its docstring and
benchmarks/README.md say what is measured and how to run it. One thread per process for BLAS and
FAISS (set before numpy and faiss load), as benchmarks/search.py."""
import os
import sys

for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

from orchestrator.benchmarks.serve_load import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
