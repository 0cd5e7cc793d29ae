"""Cost of a compatible update (train only) against a full backfill as the gallery grows.

The measurement lives in ``orchestrator.benchmarks.update_cost``; its docstring and benchmarks/README.md
say what is measured and how to run it."""
import sys

from orchestrator.benchmarks.update_cost import main

if __name__ == "__main__":
    sys.exit(main())
