"""The shipped d-Simplex pipeline on the generated shapes, with stand-in third-party checkpoints.

The measurement lives in ``orchestrator.benchmarks.dsimplex_shapes``; its docstring and
benchmarks/README.md say what is measured and how to run it."""
import sys

from orchestrator.benchmarks.dsimplex_shapes import main

if __name__ == "__main__":
    sys.exit(main())
