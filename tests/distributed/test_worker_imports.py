"""What a Ray worker imports before it runs one of the gallery's read tasks or the backfill's
scoring tasks: the task function's module, with every package on its path. Neither task needs
torch or timm, which cost a worker process about 4 s of CPU on 2 cores (measured: the module
imports in 1.3 s where it took 5.7 s), so neither is imported; the packages on the way
(``orchestrator.data``, ``gallery``, ``storage``, ``models``, ``backfill``) import their names
on first use (``orchestrator.lazy_exports``)."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from orchestrator.lazy_exports import lazy_exports

HEAVY = ("torch", "timm", "torchvision", "safetensors")
LAZY_PACKAGES = ["orchestrator.data", "orchestrator.gallery", "orchestrator.storage", "orchestrator.models",
                 "orchestrator.backfill", "orchestrator.metrics", "orchestrator.search"]


@pytest.mark.parametrize("module", ["orchestrator.distributed.gallery_read", "orchestrator.distributed.backfill_scores"])
def test_read_and_scoring_task_modules_import_neither_torch_nor_timm(module):
    code = f"import sys, {module}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_exported_name_resolves_to_the_object_its_module_defines(package):
    module = importlib.import_module(package)
    assert module.__all__ and set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        value = getattr(module, name)
        defined_in = getattr(value, "__module__", None)
        if defined_in is not None and defined_in.startswith(package + "."):
            assert getattr(importlib.import_module(defined_in), name) is value
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018 (the attribute access is what is tested)


def test_a_name_is_imported_from_its_module_on_first_use_and_then_kept():
    getattr_, dir_, names = lazy_exports("orchestrator.backfill", {"selection": ["select_top"]})
    assert names == ["select_top"] and "select_top" in dir_()
    from orchestrator.backfill.selection import select_top

    assert getattr_("select_top") is select_top
    with pytest.raises(AttributeError, match="has no attribute 'plan'"):
        getattr_("plan")


def test_a_finisher_loads_the_index_layer_when_it_starts_not_in_its_first_finish():
    """The shard store imports its index builder on first use; a finisher actor imports it as it
    is constructed (beside the embedding actors loading their model), so the step's first finish
    does not pay for FAISS and torch (the geometry's)."""
    code = ("import sys; from orchestrator.distributed.finish import Finisher; "
            "before = 'orchestrator.index.factory' in sys.modules; Finisher(print); "
            "print(before, 'orchestrator.index.factory' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]
