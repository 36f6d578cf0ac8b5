"""preemptions: the places where a spot market took a machine (or said it would)

Revision ID: 0008
Revises: 0007

Each preemption orch saw (an instance recorded ``preempted``, or ended on a spot interruption
notice) is a row: its provider, the place as the offer named it (a region or zone, a data center,
a host), the GPU and when. The planner ranks those places' offers after the others for a while
(``preempted_hours``), so a relaunch does not go straight back where it was just taken.
"""
import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

S = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "preemptions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("provider", S(length=32), nullable=False),
        sa.Column("place", S(length=128), nullable=False),
        sa.Column("gpu", S(length=128), nullable=True),
        sa.Column("instance_name", S(length=64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_preemptions_at", "preemptions", ["at"])


def downgrade() -> None:
    op.drop_table("preemptions")
