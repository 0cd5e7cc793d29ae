"""Training overhead of the orchestrator: the same training run three ways.

The measurement lives in ``orchestrator.benchmarks.train_overhead``; its docstring and benchmarks/README.md
say what is measured and how to run it."""
import sys

from orchestrator.benchmarks.train_overhead import main

if __name__ == "__main__":
    sys.exit(main())
