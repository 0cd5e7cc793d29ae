"""Alembic environment of the lineage store: runs on the connection the store passes in
(``config.attributes["connection"]``), inside the store's own write transaction."""
from alembic import context

from orchestrator.lineage.schema import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=context.config.get_main_option("version_table"),
    render_as_batch=True,  # SQLite cannot ALTER most things: later revisions rebuild tables in batches
)
with context.begin_transaction():
    context.run_migrations()
