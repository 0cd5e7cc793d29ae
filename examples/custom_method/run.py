"""Run a pipeline whose new generation uses a compatibility method defined outside the package.

    python examples/custom_method/run.py [--epochs N] [--storage DIR] [--file pipeline.yaml]

Trains `old` (independent, classes 0-4), `anchored` (the plug-in `cosine_anchor`, all classes,
aligned to `old`) and the reference `phi-star` through Ray Train, evaluates every pair and
prints the compatibility matrices and the update summary; the lineage goes to
<storage>/lineage.db (`orchestrator lineage --lineage sqlite:///<storage>/lineage.db`).

How the plug-in reaches every process
-------------------------------------
A method is found by name in the registry of the process that needs it, and a module registers
its methods when it is imported (``@register_method``). Three processes need `cosine_anchor`:

1. this driver, to validate the pipeline file: ``import cosine_anchor`` below;
2. every Ray Train worker, which builds the method from its name. Workers are separate
   processes (on a cluster, other machines) that import only what they are told to. Two pieces
   of the Ray runtime environment handle that:
   - ``py_modules: [cosine_anchor]`` ships the file to every worker and puts it on its path;
   - ``env_vars: {ORCHESTRATOR_PLUGINS: cosine_anchor}``: the registry imports the modules
     named in this variable before every lookup (``orchestrator/methods/registry.py``).
   ``run_pipeline`` only starts Ray when it is not initialised yet, so the ``ray.init`` below,
   with that runtime environment, is the one the pipeline uses.
3. ``orchestrator lineage`` reads the lineage only and never needs the method.

On a cluster, submit the same script as a job, with the working directory holding this folder:
    ray job submit --address http://127.0.0.1:8265 --working-dir examples/custom_method -- \
        python run.py --epochs 2 --storage /shared/runs/custom_method
(with ``ray.address: auto`` in the pipeline or ``RAY_ADDRESS`` set, which ``ray job submit`` does).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `python run.py` puts HERE first on the path; `runpy`/imports may not
    sys.path.insert(0, str(HERE))

import cosine_anchor  # noqa: E402  (registers the method `cosine_anchor` in this process)

from orchestrator import bounded_yaml  # noqa: E402
from orchestrator.config import load_pipeline  # noqa: E402
from orchestrator.distributed.runtime import WORKER_ENV_VARS, start_local_ray  # noqa: E402
from orchestrator.methods.registry import PLUGINS_ENV  # noqa: E402
from orchestrator.pipeline.runner import run_pipeline  # noqa: E402

PLUGIN = cosine_anchor.__name__  # "cosine_anchor": the name workers import


def plugin_list() -> str:
    """ORCHESTRATOR_PLUGINS of this process with this example's module added."""
    names = [n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    return ",".join(dict.fromkeys([*names, PLUGIN]))


def overrides(file: Path, epochs: int | None, storage: str | None) -> dict[str, object]:
    """``load_pipeline`` overrides: the storage root, and the epochs of every generation."""
    values: dict[str, object] = {"storage": storage}
    if epochs is not None:
        generations = (bounded_yaml.load(bounded_yaml.read_text(file))[0] or {}).get("generations") or []
        values.update({f"generations.{i}.training.epochs": epochs for i in range(len(generations))})
    return values


def start_ray(address: str | None, plugins: str) -> None:
    """Start or join Ray as ``run_pipeline`` would, with the plug-in in the runtime environment."""
    import ray

    runtime_env = {"py_modules": [cosine_anchor], "env_vars": {PLUGINS_ENV: plugins}}
    if address is None and not os.environ.get("RAY_ADDRESS"):
        # a local Ray gets the worker environment `connect` gives one (Ray Train polls every 0.2 s)
        runtime_env["env_vars"] = {**WORKER_ENV_VARS, **runtime_env["env_vars"]}
        start_local_ray(runtime_env=runtime_env)  # a new Ray of this process, never another on this machine
    else:
        ray.init(address=address, log_to_driver=False, runtime_env=runtime_env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run examples/custom_method/pipeline.yaml with the "
                                                 "plug-in method cosine_anchor.")
    parser.add_argument("--file", type=Path, default=HERE / "pipeline.yaml", help="pipeline YAML")
    parser.add_argument("--epochs", type=int, default=None, help="epochs of every generation (default: the file's)")
    parser.add_argument("--storage", default=None, help="storage root (default: the file's, ./runs/custom_method)")
    args = parser.parse_args(argv)

    import ray

    plugins = plugin_list()
    os.environ[PLUGINS_ENV] = plugins  # this process's registry too (and processes it starts)
    config = load_pipeline(args.file, overrides(args.file, args.epochs, args.storage))
    start_ray(config.ray.address, plugins)
    try:
        result = run_pipeline(config)
    finally:
        ray.shutdown()
    print()
    print(result.format())
    return 0


if __name__ == "__main__":
    sys.exit(main())
