"""The post-hoc maps side by side on one upgrade: the parent and the given encoder of a
``pipelines/posthoc.yaml`` run, each map fitted on paired samples of several sizes.

The measurement lives in ``orchestrator.benchmarks.posthoc_maps``; its docstring and
docs/methods.md say what is measured and how to run it."""
import sys

from orchestrator.benchmarks.posthoc_maps import main

if __name__ == "__main__":
    sys.exit(main())
