"""Revisions of the lineage schema, oldest first (Alembic loads them by file; this file is skipped)."""
