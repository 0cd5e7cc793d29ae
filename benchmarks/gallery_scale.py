"""Gallery scale: the streamed pipeline step against a plain loop at 10⁵…10⁷ items, in one run.

The measurement lives in ``orchestrator.benchmarks.gallery_scale``; its docstring and
benchmarks/README.md say what is measured and how to run it."""
import sys

from orchestrator.benchmarks.gallery_scale import main

if __name__ == "__main__":
    sys.exit(main())
