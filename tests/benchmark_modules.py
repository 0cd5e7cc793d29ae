"""Import a script of benchmarks/ as a module for the benchmark tests (importable: pytest's
pythonpath has tests/)."""
from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@contextmanager
def benchmark_module(name: str, imports: tuple[str, ...] = ()) -> Iterator[ModuleType]:
    """``benchmarks/<name>.py`` as module ``name`` while the block runs; registered in sys.modules
    (dataclasses resolve annotations through it) and removed afterwards, with the other benchmark
    modules it ``imports``."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        for loaded in (name, *imports):
            sys.modules.pop(loaded, None)
