"""volumes: data that outlives the machine (``orch volume``)

Revision ID: 0006
Revises: 0005

A volume bills from the moment its provider makes it until it is deleted, whatever runs: each one
orch makes (or finds at a provider with orch's tag) is a ``volumes`` row, written before the
provider is asked. ``volume_events`` is its history (the ``events`` table belongs to instances), and
``volume_mounts`` says which instance mounted which volume at which path: a volume is attached
while one of those instances is live.
"""
import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

S = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "volumes",
        sa.Column("id", S(length=12), primary_key=True),
        sa.Column("name", S(length=64), nullable=False),
        sa.Column("provider", S(length=32), nullable=False),
        sa.Column("provider_id", S(length=128), nullable=True),
        sa.Column("place", S(length=128), nullable=True),
        sa.Column("size_gb", sa.Integer(), nullable=False),
        sa.Column("price_gb_month", sa.Float(), nullable=True),
        sa.Column("state", S(length=16), nullable=False),
        sa.Column("idle_noted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_volumes_name", "volumes", ["name"])
    op.create_index("ix_volumes_state", "volumes", ["state"])

    op.create_table(
        "volume_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("volume_id", S(length=12), sa.ForeignKey("volumes.id"), nullable=False),
        sa.Column("from_state", S(length=16), nullable=True),
        sa.Column("to_state", S(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("actor", S(length=32), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_volume_events_volume_id", "volume_events", ["volume_id"])

    op.create_table(
        "volume_mounts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("volume_id", S(length=12), sa.ForeignKey("volumes.id"), nullable=False),
        sa.Column("instance_id", S(length=12), sa.ForeignKey("instances.id"), nullable=False),
        sa.Column("use_name", S(length=64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("host_path", sa.Text(), nullable=True),
        sa.Column("attached_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_volume_mounts_volume_id", "volume_mounts", ["volume_id"])
    op.create_index("ix_volume_mounts_instance_id", "volume_mounts", ["instance_id"])


def downgrade() -> None:
    op.drop_table("volume_mounts")
    op.drop_table("volume_events")
    op.drop_table("volumes")
