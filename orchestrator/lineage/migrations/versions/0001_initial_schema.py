"""The initial lineage schema: the nine tables as ``create_all`` made them before migrations.

A store created by that code (no version table) is adopted, not rebuilt: each table is created
only where it is missing (stores from before sweeps lack ``candidates``), then the store is
stamped with this revision. Frozen: later schema changes are new revisions, never edits here. Constraint names are spelled
out (``op.f``: final, not run through the naming convention again).

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

WHEN = sa.DateTime(timezone=True)


def _tables() -> list[tuple[str, list[sa.schema.SchemaItem]]]:
    """(name, columns and constraints) of every table, parents before children."""
    def fk(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
        return sa.ForeignKeyConstraint([column], [f"{target}.id"], name=op.f(f"fk_{table}_{column}_{target}"))

    def status(table: str, column: str, values: tuple[str, ...]) -> sa.CheckConstraint:
        return sa.CheckConstraint(f"{column} IN ({', '.join(repr(v) for v in values)})", name=op.f(f"ck_{table}_{column}"))

    def key(table: str) -> list[sa.schema.SchemaItem]:
        return [sa.Column("id", sa.Integer(), nullable=False), sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{table}"))]

    name = sa.String(255)
    return [
        ("galleries", key("galleries") + [
            sa.Column("name", name, nullable=False), sa.Column("source_uri", sa.Text()),
            sa.Column("n_items", sa.Integer()), sa.Column("n_shards", sa.Integer(), nullable=False),
            sa.Column("created_at", WHEN, nullable=False), sa.UniqueConstraint("name", name=op.f("uq_galleries_name"))]),
        ("generations", key("generations") + [
            sa.Column("name", name, nullable=False), sa.Column("parent_id", sa.Integer()),
            sa.Column("method", name), sa.Column("params", sa.JSON(), nullable=False), sa.Column("arch", name),
            sa.Column("space", sa.String(64)), sa.Column("curv", sa.Float()), sa.Column("checkpoint_uri", sa.Text()),
            sa.Column("sha256", sa.String(64)), sa.Column("status", sa.String(16), nullable=False),
            sa.Column("metrics", sa.JSON(), nullable=False), sa.Column("created_at", WHEN, nullable=False),
            sa.Column("updated_at", WHEN, nullable=False),
            status("generations", "status", ("pending", "training", "trained", "failed")),
            sa.UniqueConstraint("name", name=op.f("uq_generations_name")), fk("generations", "parent_id", "generations")]),
        ("pipeline_runs", key("pipeline_runs") + [
            sa.Column("pipeline", name, nullable=False), sa.Column("config_sha256", sa.String(64), nullable=False),
            sa.Column("invocations", sa.Integer(), nullable=False), sa.Column("created_at", WHEN, nullable=False),
            sa.Column("last_started_at", WHEN, nullable=False),
            sa.UniqueConstraint("pipeline", "config_sha256", name=op.f("uq_pipeline_runs_pipeline_config_sha256"))]),
        ("steps", key("steps") + [
            sa.Column("key", name, nullable=False), sa.Column("status", sa.String(16), nullable=False),
            sa.Column("attempts", sa.Integer(), nullable=False), sa.Column("outputs", sa.JSON(), nullable=False),
            sa.Column("error", sa.Text()), sa.Column("started_at", WHEN, nullable=False),
            sa.Column("finished_at", WHEN), status("steps", "status", ("started", "committed", "failed")),
            sa.UniqueConstraint("key", name=op.f("uq_steps_key"))]),
        ("candidates", key("candidates") + [
            sa.Column("generation_id", sa.Integer(), nullable=False), sa.Column("sweep", name, nullable=False),
            sa.Column("trial_id", name, nullable=False), sa.Column("outcome", sa.String(16), nullable=False),
            sa.Column("epochs", sa.Integer(), nullable=False), sa.Column("objective", sa.Float()),
            sa.Column("created_at", WHEN, nullable=False), sa.Column("updated_at", WHEN, nullable=False),
            sa.UniqueConstraint("sweep", "trial_id", name=op.f("uq_candidates_sweep_trial_id")),
            status("candidates", "outcome", ("finished", "stopped", "error")),
            sa.UniqueConstraint("generation_id", name=op.f("uq_candidates_generation_id")),
            fk("candidates", "generation_id", "generations")]),
        ("compatibility", key("compatibility") + [
            sa.Column("query_generation_id", sa.Integer(), nullable=False),
            sa.Column("gallery_generation_id", sa.Integer(), nullable=False),
            sa.Column("metric", sa.String(64), nullable=False), sa.Column("value", sa.Float()),
            sa.Column("dataset", name, nullable=False), sa.Column("updated_at", WHEN, nullable=False),
            sa.UniqueConstraint("query_generation_id", "gallery_generation_id", "metric", "dataset",
                                name=op.f("uq_compatibility_query_gallery_metric_dataset")),
            fk("compatibility", "query_generation_id", "generations"),
            fk("compatibility", "gallery_generation_id", "generations")]),
        ("deployments", key("deployments") + [
            sa.Column("generation_id", sa.Integer(), nullable=False), sa.Column("started_at", WHEN, nullable=False),
            fk("deployments", "generation_id", "generations")]),
        ("shards", key("shards") + [
            sa.Column("gallery_id", sa.Integer(), nullable=False), sa.Column("index", sa.Integer(), nullable=False),
            sa.Column("n_items", sa.Integer()), sa.Column("generation_id", sa.Integer()),
            sa.Column("embeddings_uri", sa.Text()), sa.Column("index_uri", sa.Text()),
            sa.Column("sha256", sa.String(64)), sa.Column("updated_at", WHEN, nullable=False),
            sa.UniqueConstraint("gallery_id", "index", name=op.f("uq_shards_gallery_id_index")),
            fk("shards", "gallery_id", "galleries"), fk("shards", "generation_id", "generations")]),
        ("backfills", key("backfills") + [
            sa.Column("shard_id", sa.Integer(), nullable=False), sa.Column("from_generation_id", sa.Integer()),
            sa.Column("to_generation_id", sa.Integer(), nullable=False), sa.Column("items", sa.Integer()),
            sa.Column("status", sa.String(16), nullable=False), sa.Column("started_at", WHEN, nullable=False),
            sa.Column("finished_at", WHEN), status("backfills", "status", ("started", "committed", "failed")),
            fk("backfills", "shard_id", "shards"), fk("backfills", "from_generation_id", "generations"),
            fk("backfills", "to_generation_id", "generations")]),
    ]


def upgrade() -> None:
    present = set(sa.inspect(op.get_bind()).get_table_names())
    for table, items in _tables():
        if table not in present:
            op.create_table(table, *items)


def downgrade() -> None:
    for table, _items in reversed(_tables()):
        op.drop_table(table)
