"""jobs and attempts: `orch run`, from a dataset to weights on disk across lost machines

Revision ID: 0003
Revises: 0002

A job is what the user asked for (its spec, its caps, where its weights are, what it cost); each
attempt is one instance that trained it, linked to its ``instances`` row (and its ``runs`` row), so
the cost of a job is the cost of its attempts' instances, from their events.
"""
import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

S = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", S(length=12), primary_key=True),
        sa.Column("name", S(length=64), nullable=False),
        sa.Column("state", S(length=16), nullable=False),
        sa.Column("spec", sa.Text(), nullable=True),
        sa.Column("plan", sa.Text(), nullable=True),
        sa.Column("max_cost", sa.Float(), nullable=True),
        sa.Column("max_hours", sa.Float(), nullable=True),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("keep", sa.Boolean(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("checkpoint_epoch", sa.Integer(), nullable=True),
        sa.Column("weights", sa.Text(), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("phases", sa.Text(), nullable=True),
        sa.Column("history", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_jobs_name", "jobs", ["name"])
    op.create_index("ix_jobs_state", "jobs", ["state"])

    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", S(length=12), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("instance_name", S(length=64), nullable=False),
        sa.Column("instance_id", S(length=12), sa.ForeignKey("instances.id"), nullable=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=True),
        sa.Column("provider", S(length=32), nullable=False),
        sa.Column("offer", sa.Text(), nullable=True),
        sa.Column("price_hr", sa.Float(), nullable=True),
        sa.Column("state", S(length=16), nullable=False),
        sa.Column("start_epoch", sa.Integer(), nullable=True),
        sa.Column("resumed_from", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("phases", sa.Text(), nullable=True),
        sa.Column("unreachable_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_attempts_job_id", "attempts", ["job_id"])
    op.create_index("ix_attempts_instance_id", "attempts", ["instance_id"])


def downgrade() -> None:
    op.drop_table("attempts")
    op.drop_table("jobs")
