"""Command line: ``orchestrator methods`` and ``orchestrator demo``."""
from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Literal, Sequence, get_args, get_origin

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
    result = run_update_experiment(methods, settings)
    print()
    print(result.report.format_table())
    print()
    print(result.format_summary())
    print(f"\nfinished in {time.perf_counter() - started:.0f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrator", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log every training step")
    commands = parser.add_subparsers(dest="command", required=True)

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
    demo.set_defaults(handler=_demo_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except ValueError as error:
        print(f"orchestrator: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
