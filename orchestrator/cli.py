"""The ``orchestrator`` command line: one subcommand per job (``run``, ``tune``, ``search``, ...).

Exit codes (``ExitCode``; docs/cli.md): 0 done; 1 a runtime failure (a failed step, a storage or
database error); 2 a usage or configuration error (bad arguments, a bad file or value: nothing was
started; also a lineage store that does not exist: ``LineageNotFound``); 3 the deployment gate held
a generation back; 4 busy: another process holds the pipeline's run lock (the message names it,
nothing was done); 5 integrity: a stored file is not what the lineage recorded (a checksum
mismatch, whichever file; a file it hashes is missing; ``verify`` found a problem or had nothing to
check); 6 an outside system (S3, PostgreSQL, SQLite, Ray) did not answer or refused: the one line
names the system, its location (credentials redacted) and what to check (``errors.OutsideSystemError``);
7 unhealthy: the health check stopped a generation at its train step (it does not learn: the one
line names it, the epochs and what was seen; nothing of it was evaluated or deployed).
Every error is reported before any other
output where it can be checked up front (arguments, files, method names).
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Sequence

from orchestrator import __version__
from orchestrator.cli_options import (
    SET_OPTION,
    HelpFormatter,
    add_pipeline_options,
    add_verbose,
    int_at_least,
    pipeline_overrides,
)
from orchestrator.errors import ExitCode, OrchestratorError
from orchestrator.gc_startup import startup_phase
from orchestrator.search.cli import add_search_command
from orchestrator.serving.cli import add_serve_command

DEMO_METHODS = ("independent", "l2", "bct", "hot_refresh", "hoc", "hbct")
DESCRIPTION = ("Train, evaluate, deploy and search backward-compatible embedding-model generations "
               "described by a pipeline file. 'orchestrator COMMAND -h' shows a command's options.")


def _methods_command(args: argparse.Namespace) -> int:
    from orchestrator.config_reference import describe_type
    from orchestrator.methods import available_methods

    for name, cls in available_methods().items():
        print(f"{name}: {cls.summary}")
        for field_name, field in cls.Params.model_fields.items():
            print(f"    {field_name:<22} {describe_type(field.annotation):<32} default {field.default!r}")
    return 0


def _schema_command(args: argparse.Namespace) -> int:
    from orchestrator.config_reference import markdown_reference, schema_text

    print(markdown_reference() if args.markdown else schema_text("tune" if args.tune else "pipeline"), end="")
    return 0


def _demo_command(args: argparse.Namespace) -> int:
    import torch

    from orchestrator.evaluation.update_experiment import ExperimentSettings, run_update_experiment
    from orchestrator.methods.registry import method_class
    from orchestrator.training.config import TrainConfig

    methods = [name.strip() for name in args.methods.split(",") if name.strip()]
    if not methods:
        raise ValueError(f"--methods names no method (got {args.methods!r})")
    for name in methods:
        method_class(name)  # an unknown name is an error before anything is printed or trained
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = ExperimentSettings(
        arch=args.arch,
        new_arch=args.new_arch,
        embed_dim=args.embed_dim,
        training=TrainConfig(epochs=args.epochs, batch_size=64, lr=0.05, augment=False, seed=args.seed),
    )
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


def _run_command(args: argparse.Namespace) -> int:
    from orchestrator.config import load_pipeline
    from orchestrator.outside import preflight

    config = load_pipeline(args.file, pipeline_overrides(args))  # checked before Ray and torch are imported
    preflight(config, storage_must_exist=False, ray=True)  # before the lineage and the lock are created
    with startup_phase():  # torch, timm, Ray, Ray Data (gc_startup)
        from orchestrator.pipeline.runner import run_pipeline

    result = run_pipeline(config)
    print()
    print(result.format())
    return 0


def _tune_command(args: argparse.Namespace) -> int:
    from orchestrator.tuning.config import load_tune_file

    tune_file = load_tune_file(args.file, pipeline_overrides(args))  # checked before Ray Tune is imported
    from orchestrator.outside import preflight

    preflight(tune_file.pipeline, storage_must_exist=False, ray=True)
    with startup_phase():
        from orchestrator.tuning.results import plot_axes
        from orchestrator.tuning.sweep import run_sweep

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
    storage = None  # without a pipeline file: the storage root the lineage recorded
    if args.file is None:
        url = args.lineage
    else:
        from orchestrator.config import load_pipeline
        from orchestrator.outside import preflight

        config = load_pipeline(args.file, pipeline_overrides(args))
        preflight(config, storage_must_exist=False)
        url, storage = config.lineage, config.storage
    with LineageStore(url, storage=storage, readonly=True) as store:
        print(json.dumps(lineage_json(store), indent=2) if args.json else lineage_tree_text(store))
    return 0


@contextmanager
def _served_store(args: argparse.Namespace, readonly: bool = False) -> Iterator[tuple[Any, Any, str]]:
    """(config, its lineage store, its absolute storage root) for the operations commands, the
    store closed when the block ends: the storage must exist and the lineage too (``readonly``:
    opened for reading, nothing created)."""
    from orchestrator.config import load_pipeline

    config = load_pipeline(args.file, pipeline_overrides(args))  # checked before the store is opened
    from orchestrator.lineage import LineageStore
    from orchestrator.outside import preflight
    from orchestrator.pipeline.runner import storage_root

    preflight(config, storage_must_exist=True)
    with LineageStore(config.lineage, storage=config.storage, readonly=readonly) as store:
        yield config, store, storage_root(config.storage)


def _deploy_command(args: argparse.Namespace) -> int:
    from orchestrator.pipeline.operations import redeploy

    with _served_store(args) as (config, store, _storage), store.run_lock(config.name, "orchestrator deploy"):
        redeploy(store, config.gallery.name, args.generation, args.rollback, print)
    return 0


def _gc_command(args: argparse.Namespace) -> int:
    from orchestrator.pipeline.operations import collect_garbage

    with _served_store(args, readonly=args.dry_run) as (config, store, storage):
        if args.dry_run:  # reads only: no lock either
            collection = collect_garbage(store, storage, config.gallery.name, args.keep_deployments, dry_run=True)
        else:
            with store.run_lock(config.name, "orchestrator gc"):
                collection = collect_garbage(store, storage, config.gallery.name, args.keep_deployments,
                                             dry_run=False)
    for uri in collection.removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {uri}")
    print(collection.describe())
    return 0


def _verify_command(args: argparse.Namespace) -> int:
    writes = args.adopt or args.rebuild_lineage or args.migrate_stores  # verify alone reads only: it changes nothing
    with _served_store(args, readonly=not writes) as (config, store, storage):
        from orchestrator.pipeline.verify import verify_storage  # after the file's checks: a bad file answers sooner

        for line in _repairs(args, config, store, storage):
            print(line)
        result = verify_storage(store, storage)
    for line in result.lines():
        print(line)
    return ExitCode.OK if result.ok else ExitCode.INTEGRITY


def _repairs(args: argparse.Namespace, config: Any, store: Any, storage: str) -> Iterator[str]:
    """What ``verify``'s repair flags do before the check, a line per change: the lineage rebuilt
    from the stored files, unhashed files adopted, stores migrated."""
    if args.rebuild_lineage:
        from orchestrator.pipeline.recover import rebuild_lineage

        yield from rebuild_lineage(store, storage, config.data.eval_split).lines()
    if args.adopt:
        from orchestrator.pipeline.verify import adopt_unhashed

        yield from (f"adopted {uri}" for uri in adopt_unhashed(store))
    if args.migrate_stores:
        from orchestrator.stores.migrate import migrate_stores

        yield from migrate_stores(store)


def _add_verify_command(commands: argparse._SubParsersAction) -> None:
    """``verify``: check every stored artefact against the hashes in the lineage (like ``git fsck``)."""
    verify = commands.add_parser("verify", help="check every checkpoint, card, shard file and index against the "
                                                 "lineage's hashes; list missing and unreferenced files "
                                                 "(exit 5 on any mismatch or missing file, or nothing to "
                                                 "check); reads only")
    verify.add_argument("file", help="pipeline YAML whose storage and lineage to check")
    add_pipeline_options(verify, ("storage", "lineage"))
    verify.add_argument("--adopt", action="store_true",
                        help="first record the hashes a lineage written by an older version lacks, trusting the "
                             "cards and indexes as they are now (weights and shard files are still checked)")
    verify.add_argument("--migrate-stores", action="store_true",
                        help="first bring pgvector tables and Lance datasets written by an earlier layout to the "
                             "current one in place (add and fill the search and raw columns, rebuild the index, "
                             "record the new digest; docs/stores.md); run it while no pipeline writes")
    verify.add_argument("--rebuild-lineage", action="store_true",
                        help="first rebuild a lost or emptied lineage from the storage's own files (cards and "
                             "weights, shard and index files, the last plan), refusing whatever disagrees "
                             "(docs/troubleshooting.md)")
    verify.set_defaults(handler=_verify_command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrator", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_verbose(parser, top_level=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run_commands(commands)
    add_search_command(commands)
    add_serve_command(commands)
    _add_inspection_commands(commands)
    _add_verify_command(commands)
    for command in commands.choices.values():  # every subcommand, wherever it was defined
        command.formatter_class = HelpFormatter
        add_verbose(command, top_level=False)
    return parser


def _add_run_commands(commands: argparse._SubParsersAction) -> None:
    """``run``, ``tune``, ``deploy``, ``gc``: the commands that change a pipeline's storage."""
    run = commands.add_parser("run", help="run a pipeline file: train, evaluate and deploy every generation "
                                           "(resumes where a previous run stopped)")
    run.add_argument("file", help="pipeline YAML, e.g. pipelines/lifelong.yaml")
    add_pipeline_options(run, ("storage", "lineage", "ray_address", SET_OPTION))
    run.set_defaults(handler=_run_command)

    tune = commands.add_parser("tune", help="sweep a generation's method parameters with Ray Tune (ASHA, Optuna); "
                                             "resumes an interrupted sweep")
    tune.add_argument("file", help="tune YAML, e.g. pipelines/tune.yaml")
    add_pipeline_options(tune, ("storage", "lineage", "ray_address", SET_OPTION))  # applied to the pipeline it names
    tune.set_defaults(handler=_tune_command)

    deploy = commands.add_parser("deploy", help="serve an earlier deployed generation again, with the shards it "
                                                 "served with (a rollback); search follows it")
    deploy.add_argument("file", help="pipeline YAML whose lineage and gallery to re-point")
    add_pipeline_options(deploy, ("storage", "lineage"))
    target = deploy.add_mutually_exclusive_group(required=True)
    target.add_argument("--generation", help="the generation to serve")
    target.add_argument("--rollback", action="store_true", help="the generation served before the current one")
    deploy.set_defaults(handler=_deploy_command)

    gc = commands.add_parser("gc", help="remove shard files and Ray Train epoch checkpoints nothing retained needs")
    gc.add_argument("file", help="pipeline YAML whose storage to collect")
    add_pipeline_options(gc, ("storage", "lineage"))
    gc.add_argument("--keep-deployments", type=int_at_least(1), default=2, metavar="N",
                    help="newest deployments (the serving one included) whose shard files are kept for a rollback")
    gc.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    gc.set_defaults(handler=_gc_command)


def _add_inspection_commands(commands: argparse._SubParsersAction) -> None:
    """``lineage``, ``methods``, ``schema``, ``demo``: commands that read, describe or try."""
    lineage = commands.add_parser("lineage", help="show the generation tree, metrics and gallery shards")
    lineage.add_argument("file", nargs="?", help="pipeline YAML whose lineage store to read (or only --lineage)")
    add_pipeline_options(lineage, ("storage", "lineage"))
    lineage.add_argument("--json", action="store_true", help="machine-readable JSON")
    lineage.set_defaults(handler=_lineage_command)

    methods = commands.add_parser("methods", help="list compatibility methods with their parameters and defaults")
    methods.set_defaults(handler=_methods_command)

    schema = commands.add_parser("schema", help="print the JSON Schema of a pipeline file (for editors), or the "
                                                 "configuration reference (docs/configuration.md)")
    schema.add_argument("--markdown", action="store_true", help="the Markdown reference of pipeline and tune files")
    schema.add_argument("--tune", action="store_true", help="the JSON Schema of a tune file instead")
    schema.set_defaults(handler=_schema_command)

    demo = commands.add_parser("demo", help="train an old and compatible new models on the bundled digits "
                                             "without Ray; print the compatibility table")
    demo.add_argument("--methods", default=",".join(DEMO_METHODS), help="comma-separated method names of the new models")
    demo.add_argument("--epochs", type=int_at_least(1), default=20, help="training epochs of every model")
    demo.add_argument("--arch", default="test_resnet", help="timm architecture of the old and reference models")
    demo.add_argument("--new-arch", default=None,
                      help="timm architecture of the new models (a new-architecture update; default: --arch)")
    demo.add_argument("--embed-dim", type=int_at_least(2), default=32, help="embedding size of every model")
    demo.add_argument("--seed", type=int, default=0, help="training seed (same seed, same weights)")
    demo.add_argument("--threads", type=int_at_least(0), default=1, help="torch CPU threads; 0 lets torch choose")
    demo.add_argument("--workers", type=int_at_least(1), default=1,
                      help="processes training models in parallel (one torch thread each); same results")
    demo.set_defaults(handler=_demo_command)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # `-h`, `--version` and bad arguments import no torch
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except Exception as error:
        code = _reported(error, args.verbose)
        if code is None:
            raise
        return code


#: The exit code and the word of the one line of an error the project does not define, by the
#: builtin class it is (its most specific one listed here); word None: a file, storage or database
#: problem, told with its type and shown with its traceback under ``-v``.
_BUILTIN_REPORTS: dict[type, tuple[ExitCode, str | None]] = {
    ValueError: (ExitCode.USAGE, "error"),  # bad input: the message names the file, field and value
    ImportError: (ExitCode.USAGE, "error"),
    LookupError: (ExitCode.USAGE, "error"),  # a generation or gallery the lineage does not know, named
    RuntimeError: (ExitCode.FAILED, "failed"),  # a failed step; the lineage records it and a re-run resumes
    OSError: (ExitCode.FAILED, None),  # a missing file, a storage problem
}


def _reported(error: Exception, verbose: bool) -> ExitCode | None:
    """Print ``error`` as its one line and return its exit code: one of the project's errors as it
    carries them (``errors.OrchestratorError``; an outside system's, S3, PostgreSQL, SQLite or Ray,
    was translated into ``OutsideSystemError`` where it arose), any other by its builtin class
    (``_BUILTIN_REPORTS``). None: an error of no kind there, or under ``-v`` an outside system's,
    storage or database error: its traceback is shown instead."""
    from orchestrator.outside import explain

    reported = _report_of(explain(error) or error, verbose)  # explain: an object store's error raised elsewhere
    if reported is not None:
        print(f"orchestrator: {reported[0]}", file=sys.stderr)
        return reported[1]
    return None


def _report_of(error: Exception, verbose: bool) -> tuple[str, ExitCode] | None:
    """(the line after ``orchestrator: ``, the exit code) of ``error`` (``_reported``)."""
    if isinstance(error, OrchestratorError):
        return None if verbose and error.traceback_under_verbose else (error.report_line(), error.exit_code)
    database = getattr(sys.modules.get("sqlalchemy.exc"), "SQLAlchemyError", None)  # none unless it was imported
    reports = _BUILTIN_REPORTS if database is None else {**_BUILTIN_REPORTS, database: (ExitCode.FAILED, None)}
    code, word = next((reports[kind] for kind in type(error).__mro__ if kind in reports), (None, None))
    if code is None or (word is None and verbose):
        return None
    if word is None:
        text = " ".join(str(error).split()) or type(error).__name__
        return f"error: {type(error).__name__}: {text[:500]} (-v shows the traceback)", code
    return f"{word}: {error}", code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
