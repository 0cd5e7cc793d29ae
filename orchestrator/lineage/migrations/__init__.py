"""Alembic migrations of the lineage schema (``versions/``: one revision per schema change).

Writers upgrade a store to the newest revision when they open it (``orchestrator.lineage.migrate``);
there is no alembic.ini: the store builds the Alembic configuration itself and hands ``env.py`` its
open connection. A new revision: add ``versions/NNNN_what.py`` whose ``down_revision`` is the
current head, change ``schema.py`` to match, and keep ``tests/lineage/test_lineage_migrations.py``
(the migrated schema equals the models on SQLite and PostgreSQL) passing.
"""
