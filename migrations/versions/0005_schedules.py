"""schedules: jobs that start themselves (``orch schedule``)

Revision ID: 0005
Revises: 0004
"""
from alembic import op  # noqa: F401

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # filled in by the schedules change


def downgrade() -> None:
    pass
