"""Command-line options shared by the commands that act on a pipeline's storage and lineage."""
from __future__ import annotations

import argparse

LINEAGE_HELP = ("lineage database URL, overrides the file: sqlite:///path/lineage.db or "
                "postgresql+psycopg://user@host/db (password from PGPASSWORD or ~/.pgpass, never the URL)")


def add_location_options(parser: argparse.ArgumentParser, storage: bool = True) -> None:
    """``--storage`` (unless ``storage=False``) and ``--lineage``."""
    if storage:
        parser.add_argument("--storage", help="storage root (local path or s3://bucket/prefix), overrides the file")
    parser.add_argument("--lineage", help=LINEAGE_HELP)


def location_overrides(args: argparse.Namespace) -> dict[str, object]:
    """The pipeline-file overrides of ``--storage`` and ``--lineage`` (those given)."""
    return {key: getattr(args, key) for key in ("storage", "lineage") if getattr(args, key, None)}
