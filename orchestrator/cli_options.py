"""What the ``orchestrator`` subcommands share: the help format, the options that override fields
of a pipeline file, ``-v``, and argument types.

A pipeline-override option is one row of ``PIPELINE_OPTIONS`` (flag, the dotted field it sets,
help); ``add_pipeline_options(parser, names)`` adds the named rows (and ``--set``) to a subcommand
and ``pipeline_overrides(args)`` turns whatever was given into the ``overrides`` mapping of
``orchestrator.config.load_pipeline``. A new override is one new row.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Sequence


class HelpFormatter(argparse.HelpFormatter):
    """Help with every meaningful default shown: ``(default: X)`` is appended to an option's help
    unless the default is None / False (nothing to show) or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS)) or "default" in text
                or not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))):
            return text
        return f"{text} (default: %(default)s)"


@dataclass(frozen=True)
class PipelineOption:
    """A command-line option that overrides one field of the pipeline file."""

    name: str  # the key ``add_pipeline_options`` takes; also the attribute on the parsed args
    flag: str
    field: str  # dotted field path in the pipeline file
    help: str


PIPELINE_OPTIONS: tuple[PipelineOption, ...] = (
    PipelineOption("storage", "--storage", "storage",
                   "storage root (a local path or s3://bucket/prefix); overrides the file's 'storage'"),
    PipelineOption("lineage", "--lineage", "lineage",
                   "lineage database URL (sqlite:///path/lineage.db or postgresql+psycopg://user@host/db; "
                   "password from PGPASSWORD or ~/.pgpass, never the URL); overrides the file's 'lineage'"),
    PipelineOption("ray_address", "--ray-address", "ray.address",
                   "Ray cluster address (auto, host:port, ray://host:10001); overrides the file's 'ray.address'"),
)
SET_OPTION = "set"  # the generic --set FIELD.PATH=VALUE


def add_pipeline_options(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    """Add the pipeline-override options ``names`` (rows of ``PIPELINE_OPTIONS``, or ``"set"``)."""
    by_name = {option.name: option for option in PIPELINE_OPTIONS}
    for name in names:
        if name == SET_OPTION:
            parser.add_argument("--set", action="append", metavar="FIELD.PATH=VALUE",
                                help="override any field of the pipeline file, e.g. "
                                     "--set generations.0.training.epochs=2 (repeatable)")
        else:
            option = by_name[name]
            parser.add_argument(option.flag, dest=option.name, metavar=option.field.split(".")[-1].upper(),
                                help=option.help)


def pipeline_overrides(args: argparse.Namespace) -> dict[str, object]:
    """``{dotted field: value}`` of the pipeline-override options given on the command line
    (``--set`` pairs first, then the named options, which win)."""
    overrides = parse_set_pairs(getattr(args, SET_OPTION, None) or [])
    for option in PIPELINE_OPTIONS:
        value = getattr(args, option.name, None)
        if value is not None:
            overrides[option.field] = value
    return overrides


def parse_set_pairs(pairs: Sequence[str]) -> dict[str, object]:
    """``--set a.b=value`` pairs → {"a.b": value}; values are read as YAML (1 → int), within the
    bounds of ``orchestrator.limits`` (``orchestrator.bounded_yaml``)."""
    import yaml

    from orchestrator.bounded_yaml import load_value

    overrides: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects FIELD.PATH=VALUE, got {pair!r}")
        try:
            overrides[key.strip()] = load_value(value)
        except yaml.YAMLError as err:
            raise ValueError(f"--set {key.strip()}: not a YAML value ({' '.join(str(err).split())})") from None
    return overrides


def add_verbose(parser: argparse.ArgumentParser, top_level: bool) -> None:
    """``-v`` on the top-level parser (default False) and on every subcommand (no default of its
    own, so ``orchestrator -v run ...`` and ``orchestrator run ... -v`` both set it)."""
    parser.add_argument("-v", "--verbose", action="store_true", default=False if top_level else argparse.SUPPRESS,
                        help="log every step (INFO) and show the traceback of an error")


def int_at_least(minimum: int):
    """An argparse type: a whole number ≥ ``minimum`` (a usage error naming the value otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a number of at least {minimum}, got {value}")
        return value

    return parse
