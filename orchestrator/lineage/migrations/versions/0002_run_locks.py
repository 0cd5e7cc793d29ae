"""Who holds a pipeline's run lock: one row per pipeline, written by the run that took the lock
(the lock itself is a PostgreSQL advisory lock or a file lock beside a SQLite store; the row only
names its holder for the "busy" message).

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_locks",
        sa.Column("pipeline", sa.String(255), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("pipeline", name=op.f("pk_run_locks")),
    )


def downgrade() -> None:
    op.drop_table("run_locks")
