"""ASHA against the full grid of the same search space, on the embedded default, in one run.

The measurement lives in ``orchestrator.benchmarks.tune_asha_vs_grid``; its docstring and
benchmarks/README.md say what is measured and how to run it."""
import sys
from pathlib import Path

from orchestrator.benchmarks.tune_asha_vs_grid import main

LIFELONG = Path(__file__).resolve().parents[1] / "pipelines" / "lifelong.yaml"

if __name__ == "__main__":
    sys.exit(main(LIFELONG))
