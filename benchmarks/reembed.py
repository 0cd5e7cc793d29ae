"""Re-embedding throughput: the same generation embedding the same images two ways, in one run.

The measurement lives in ``orchestrator.benchmarks.reembed``; its docstring and benchmarks/README.md
say what is measured and how to run it."""
import sys

from orchestrator.benchmarks.reembed import main

if __name__ == "__main__":
    sys.exit(main())
