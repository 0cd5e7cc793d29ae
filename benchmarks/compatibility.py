"""Compatibility of every method on the digits and the generated shapes at two training budgets.

The measurement lives in ``orchestrator.benchmarks.compatibility``; its docstring and
benchmarks/README.md say what is measured and how to run it."""
import sys

from orchestrator.benchmarks.compatibility import main

if __name__ == "__main__":
    sys.exit(main())
