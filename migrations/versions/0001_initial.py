"""instances, events, runs, meta

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

S = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "instances",
        sa.Column("id", S(length=12), primary_key=True),
        sa.Column("name", S(length=64), nullable=False),
        sa.Column("provider", S(length=32), nullable=False),
        sa.Column("provider_id", S(length=128), nullable=True),
        sa.Column("label", S(length=128), nullable=False),
        sa.Column("state", S(length=16), nullable=False),
        sa.Column("gpu", S(length=64), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("cpu_only", sa.Boolean(), nullable=False),
        sa.Column("disk_gb", sa.Integer(), nullable=False),
        sa.Column("image", S(length=256), nullable=True),
        sa.Column("spot", sa.Boolean(), nullable=False),
        sa.Column("bid", sa.Float(), nullable=True),
        sa.Column("gpu_name", S(length=128), nullable=True),
        sa.Column("price_hr", sa.Float(), nullable=False),
        sa.Column("stopped_price_hr", sa.Float(), nullable=False),
        sa.Column("ssh_host", S(length=255), nullable=True),
        sa.Column("ssh_port", sa.Integer(), nullable=True),
        sa.Column("ssh_user", S(length=64), nullable=True),
        sa.Column("host_key", sa.Text(), nullable=True),
        sa.Column("device", S(length=255), nullable=True),
        sa.Column("protected", sa.Boolean(), nullable=False),
        sa.Column("policy", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_instances_name", "instances", ["name"])
    op.create_index("ix_instances_provider_id", "instances", ["provider_id"])
    op.create_index("ix_instances_state", "instances", ["state"])

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("instance_id", S(length=12), sa.ForeignKey("instances.id"), nullable=False),
        sa.Column("from_state", S(length=16), nullable=True),
        sa.Column("to_state", S(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("actor", S(length=32), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_events_instance_id", "events", ["instance_id"])
    op.create_index("ix_events_at", "events", ["at"])

    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("instance_id", S(length=12), sa.ForeignKey("instances.id"), nullable=False),
        sa.Column("model", S(length=64), nullable=False),
        sa.Column("data", sa.Text(), nullable=True),
        sa.Column("data_bytes", sa.Integer(), nullable=True),
        sa.Column("epochs", sa.Integer(), nullable=False),
        sa.Column("run_dir", sa.Text(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("args", sa.Text(), nullable=True),
        sa.Column("state", S(length=16), nullable=False),
        sa.Column("gpu_name", S(length=128), nullable=True),
        sa.Column("mean_epoch_seconds", sa.Float(), nullable=True),
        sa.Column("peak_vram_gb", sa.Float(), nullable=True),
        sa.Column("completed_epochs", sa.Integer(), nullable=True),
        sa.Column("best_metric", sa.Float(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("pulled_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_runs_instance_id", "runs", ["instance_id"])

    op.create_table(
        "meta",
        sa.Column("key", S(length=64), primary_key=True),
        sa.Column("value", sa.Text(), nullable=True),
    )


def downgrade() -> None:
    for table in ("meta", "runs", "events", "instances"):
        op.drop_table(table)
