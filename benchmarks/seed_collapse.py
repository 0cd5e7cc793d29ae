"""How many seeds of each method's new model collapse to chance (issue 38).

The measurement lives in ``orchestrator.benchmarks.seed_collapse``; its docstring and
benchmarks/README.md say what is measured and how to run it."""
import sys

from orchestrator.benchmarks.seed_collapse import main

if __name__ == "__main__":
    sys.exit(main())
