"""volumes: data that outlives the machine (``orch volume``)

Revision ID: 0006
Revises: 0005
"""
from alembic import op  # noqa: F401

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # filled in by the volumes change


def downgrade() -> None:
    pass
