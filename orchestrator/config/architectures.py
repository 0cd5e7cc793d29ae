"""Whether ``model.arch`` names a timm model, answered without importing timm where it can be.

Importing timm imports torch and torchvision (several seconds of CPU, most of a gigabyte), which a
command that only reads or validates a pipeline file should not pay. timm's list of model names
is therefore kept in a cache file per installed timm version (``timm-<version>-models.json`` under
``$ORCHESTRATOR_CACHE``, default ``$XDG_CACHE_HOME/orchestrator`` or ``~/.cache/orchestrator``),
written the first time timm is asked. Only a name found in that list is accepted from the cache;
any other name (a typo, a ``name.pretrained_tag``, a model a plug-in registers with timm) is
asked of timm itself, which also suggests the nearest names.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

CACHE_ENV = "ORCHESTRATOR_CACHE"


def unknown_architectures(names: list[str]) -> dict[str, list[str]]:
    """``{name: timm's model names}`` for each of ``names`` that timm does not know (empty when all
    are known; the list is for suggestions)."""
    cached = _cached_model_names()
    if cached is not None and all(name in cached for name in names):
        return {}
    import timm

    known = timm.list_models()
    _write_cache(known)
    return {name: known for name in names if not timm.is_model(name)}


def cache_file() -> Path:
    """The cache file of the installed timm version's model names."""
    root = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orchestrator"
    return Path(root) / f"timm-{importlib.metadata.version('timm')}-models.json"


def _cached_model_names() -> frozenset[str] | None:
    try:
        names: Any = json.loads(cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError, importlib.metadata.PackageNotFoundError):
        return None
    return frozenset(names) if isinstance(names, list) and all(isinstance(n, str) for n in names) else None


def _write_cache(names: list[str]) -> None:
    """Write the list atomically (a temporary file renamed into place); a cache that cannot be
    written is skipped: timm is then asked again next time."""
    try:
        path = cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(sorted(names)), encoding="utf-8")
        partial.replace(path)
    except OSError:
        pass
