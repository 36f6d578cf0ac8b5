"""schedules: jobs that start themselves (``orch schedule``)

Revision ID: 0005
Revises: 0004

A schedule is a cron in a time zone with what each run runs (the job's spec, fixed when it was
added, and the snapshot of its workdir), its ceilings, window and rules, and the oldest occurrence
no pass has settled (``due_at``). Each occurrence a reaper pass settles is a ``schedule_runs`` row,
unique per schedule: the row is how one pass, of however many reapers share the ledger, owns it.
"""
import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

S = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", S(length=12), primary_key=True),
        sa.Column("name", S(length=64), nullable=False),
        sa.Column("cron", S(length=128), nullable=False),
        sa.Column("tz", S(length=64), nullable=False),
        sa.Column("window", S(length=16), nullable=True),
        sa.Column("max_price", sa.Float(), nullable=True),
        sa.Column("max_cost", sa.Float(), nullable=True),
        sa.Column("overlap", S(length=8), nullable=False),
        sa.Column("misfire", S(length=8), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("task_file", sa.Text(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("snapshot", sa.Text(), nullable=True),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_schedules_name", "schedules", ["name"], unique=True)

    op.create_table(
        "schedule_runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("schedule_id", S(length=12), sa.ForeignKey("schedules.id"), nullable=False),
        sa.Column("occurrence", sa.DateTime(timezone=True), nullable=False),
        sa.Column("name", S(length=64), nullable=False),
        sa.Column("state", S(length=16), nullable=False),
        sa.Column("job_id", S(length=12), sa.ForeignKey("jobs.id"), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("price_hr", sa.Float(), nullable=True),
        sa.Column("usd", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("schedule_id", "occurrence", name="uq_schedule_runs_occurrence"),
    )
    op.create_index("ix_schedule_runs_schedule_id", "schedule_runs", ["schedule_id"])
    op.create_index("ix_schedule_runs_name", "schedule_runs", ["name"])
    op.create_index("ix_schedule_runs_job_id", "schedule_runs", ["job_id"])


def downgrade() -> None:
    op.drop_table("schedule_runs")
    op.drop_table("schedules")
