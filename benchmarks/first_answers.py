"""The first answers: CPU seconds and peak memory of commands that only validate or refuse.

The measurement lives in ``orchestrator.benchmarks.first_answers``; its docstring and
benchmarks/README.md say what is measured and how to run it."""
import sys

from orchestrator.benchmarks.first_answers import main

if __name__ == "__main__":
    sys.exit(main())
