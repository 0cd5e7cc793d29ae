"""Command line: ``orchestrator run``, ``tune``, ``search``, ``lineage``, ``deploy``, ``gc``, ``methods``
and ``demo``. Exit codes: 0 done, 1 a failed step or a storage/database error, 2 bad input (also a
lineage store that does not exist), 3 the gate held a generation back, 4 busy: another process
holds the pipeline's run lock (the message names it)."""
from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Literal, Sequence, get_args, get_origin

from orchestrator.cli_options import add_location_options, location_overrides
from orchestrator.search.cli import add_search_command

DEMO_METHODS = ("independent", "l2", "bct", "hot_refresh", "hoc", "hbct")


def _methods_command(args: argparse.Namespace) -> int:
    from orchestrator.methods import available_methods

    for name, cls in available_methods().items():
        print(f"{name}: {cls.summary}")
        for field_name, field in cls.Params.model_fields.items():
            print(f"    {field_name:<22} {_describe_type(field.annotation):<32} default {field.default!r}")
    return 0


def _describe_type(annotation: object) -> str:
    """``Literal['a', 'b']`` → ``a|b``; ``float | None`` → ``float|None``; classes by name."""
    if get_origin(annotation) is Literal:
        return "|".join(str(choice) for choice in get_args(annotation))
    if get_args(annotation):
        return "|".join(_describe_type(arg) for arg in get_args(annotation))
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def _demo_command(args: argparse.Namespace) -> int:
    import torch

    from orchestrator.experiment import ExperimentSettings, run_update_experiment
    from orchestrator.training.config import TrainConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = ExperimentSettings(
        arch=args.arch,
        new_arch=args.new_arch,
        embed_dim=args.embed_dim,
        training=TrainConfig(epochs=args.epochs, batch_size=64, lr=0.05, augment=False, seed=args.seed),
    )
    methods = [name.strip() for name in args.methods.split(",") if name.strip()]
    started = time.perf_counter()
    print(f"extended-class update on the bundled digits: old model on classes 0-4, new models on 0-9 "
          f"({', '.join(methods)}; {args.epochs} epochs each)", flush=True)
    result = run_update_experiment(methods, settings, workers=args.workers)
    print()
    print(result.report.format_table())
    print()
    print(result.format_summary())
    print(f"\nfinished in {time.perf_counter() - started:.0f} s")
    return 0


def _parse_overrides(pairs: Sequence[str]) -> dict[str, object]:
    """``--set a.b=value`` pairs → {"a.b": value}; values are read as YAML (1 → int), within the
    bounds of ``orchestrator.limits`` (``orchestrator.bounded_yaml``)."""
    import yaml

    from orchestrator.bounded_yaml import load_value

    overrides: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects FIELD.PATH=VALUE, got {pair!r}")
        try:
            overrides[key.strip()] = load_value(value)
        except yaml.YAMLError as err:
            raise ValueError(f"--set {key.strip()}: not a YAML value ({' '.join(str(err).split())})") from None
    return overrides


def _run_command(args: argparse.Namespace) -> int:
    from orchestrator.config import load_pipeline
    from orchestrator.pipeline.runner import run_pipeline

    overrides = {**_parse_overrides(args.set or []), **location_overrides(args)}
    if args.ray_address:
        overrides["ray.address"] = args.ray_address
    config = load_pipeline(args.file, overrides)
    result = run_pipeline(config)
    print()
    print(result.format())
    return 0


def _tune_command(args: argparse.Namespace) -> int:
    from orchestrator.tuning.config import load_tune_file
    from orchestrator.tuning.results import plot_axes
    from orchestrator.tuning.sweep import run_sweep

    tune_file = load_tune_file(args.file, location_overrides(args))
    result = run_sweep(tune_file)
    objective = tune_file.spec.objective
    print()
    print(result.format(list(dict.fromkeys([*objective.metrics, *plot_axes(objective), "objective"]))))
    return 0


def _lineage_command(args: argparse.Namespace) -> int:
    import json

    from orchestrator.lineage import LineageStore, lineage_json, lineage_tree_text

    if args.file is None and not args.lineage:
        raise ValueError("lineage: give a pipeline file or --lineage URL")
    if args.file is None:
        url = args.lineage
    else:
        from orchestrator.config import load_pipeline

        url = load_pipeline(args.file, location_overrides(args)).lineage
    store = LineageStore(url, readonly=True)
    print(json.dumps(lineage_json(store), indent=2) if args.json else lineage_tree_text(store))
    return 0


def _served_store(args: argparse.Namespace):
    """(config, its lineage store, its absolute storage root) for the operations commands."""
    from orchestrator.config import load_pipeline
    from orchestrator.lineage import LineageStore
    from orchestrator.pipeline.runner import storage_root

    config = load_pipeline(args.file, location_overrides(args))
    return config, LineageStore(config.lineage), storage_root(config.storage)


def _deploy_command(args: argparse.Namespace) -> int:
    from orchestrator.pipeline.operations import redeploy

    config, store, _storage = _served_store(args)
    with store.run_lock(config.name, "orchestrator deploy"):
        redeploy(store, config.gallery.name, args.generation, args.rollback, print)
    return 0


def _gc_command(args: argparse.Namespace) -> int:
    from orchestrator.pipeline.operations import collect_garbage

    config, store, storage = _served_store(args)
    with store.run_lock(config.name, "orchestrator gc"):
        collection = collect_garbage(store, storage, config.gallery.name, args.keep_deployments, args.dry_run)
    for uri in collection.removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {uri}")
    print(collection.describe())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrator", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log every training step")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run a pipeline file: train, evaluate and deploy every generation "
                                           "(resumes where a previous run stopped)")
    run.add_argument("file", help="pipeline YAML, e.g. pipelines/lifelong.yaml")
    add_location_options(run)
    run.add_argument("--ray-address", help="Ray cluster address (auto, host:port, ray://...), overrides the file")
    run.add_argument("--set", action="append", metavar="FIELD.PATH=VALUE",
                     help="override any field, e.g. --set generations.0.training.epochs=2 (repeatable)")
    run.set_defaults(handler=_run_command)

    deploy = commands.add_parser("deploy", help="serve an earlier deployed generation again, with the shards it "
                                                 "served with (a rollback); search follows it")
    deploy.add_argument("file", help="pipeline YAML whose lineage and gallery to re-point")
    add_location_options(deploy)
    target = deploy.add_mutually_exclusive_group(required=True)
    target.add_argument("--generation", help="the generation to serve")
    target.add_argument("--rollback", action="store_true", help="the generation served before the current one")
    deploy.set_defaults(handler=_deploy_command)

    gc = commands.add_parser("gc", help="remove shard files and Ray Train epoch checkpoints nothing retained needs")
    gc.add_argument("file", help="pipeline YAML whose storage to collect")
    add_location_options(gc)
    gc.add_argument("--keep-deployments", type=int, default=2,
                    help="newest deployments whose shard files are kept for a rollback (default 2)")
    gc.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    gc.set_defaults(handler=_gc_command)

    tune = commands.add_parser("tune", help="sweep a generation's method parameters with Ray Tune (ASHA, Optuna); "
                                             "resumes an interrupted sweep")
    tune.add_argument("file", help="tune YAML, e.g. pipelines/tune.yaml")
    add_location_options(tune)
    tune.set_defaults(handler=_tune_command)

    add_search_command(commands)

    lineage = commands.add_parser("lineage", help="show the generation tree, metrics and gallery shards")
    lineage.add_argument("file", nargs="?", help="pipeline YAML whose lineage store to read (or only --lineage)")
    add_location_options(lineage)
    lineage.add_argument("--json", action="store_true", help="machine-readable JSON")
    lineage.set_defaults(handler=_lineage_command)

    methods = commands.add_parser("methods", help="list compatibility methods with their parameters and defaults")
    methods.set_defaults(handler=_methods_command)

    demo = commands.add_parser("demo", help="train an old and compatible new models on the bundled digits; "
                                             "print the compatibility table")
    demo.add_argument("--methods", default=",".join(DEMO_METHODS), help="comma-separated method names")
    demo.add_argument("--epochs", type=int, default=20)
    demo.add_argument("--arch", default="test_resnet", help="timm architecture of the old and reference models")
    demo.add_argument("--new-arch", default=None, help="timm architecture of the new models (new-architecture update)")
    demo.add_argument("--embed-dim", type=int, default=32)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = torch's default)")
    demo.add_argument("--workers", type=int, default=1,
                      help="processes training models in parallel (one torch thread each); same results")
    demo.set_defaults(handler=_demo_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.lineage.errors import LineageBusy, LineageNotFound
    from orchestrator.pipeline.gate import DeploymentHeld

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except LineageNotFound as error:  # a reader never creates a store
        print(f"orchestrator: error: LineageNotFound: {error}", file=sys.stderr)
        return 2
    except LineageBusy as error:  # another run of the pipeline holds its lock; nothing was done
        print(f"orchestrator: busy: {error}", file=sys.stderr)
        return 4
    except (ValueError, ImportError) as error:  # bad input: the message names the file, field and value
        print(f"orchestrator: error: {error}", file=sys.stderr)
        return 2
    except DeploymentHeld as error:  # the gate held a generation back: nothing broke, nothing was deployed
        print(f"orchestrator: held: {error}", file=sys.stderr)
        return 3
    except RuntimeError as error:  # a failed step; the lineage records it and a re-run resumes
        print(f"orchestrator: failed: {error}", file=sys.stderr)
        return 1
    except (OSError, SQLAlchemyError) as error:  # a missing file, a storage or database problem: one line
        if args.verbose:
            raise
        text = " ".join(str(error).split()) or type(error).__name__
        print(f"orchestrator: error: {type(error).__name__}: {text[:500]} (-v shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
