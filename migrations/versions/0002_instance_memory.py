"""instances.memory: what orch remembers about an instance, kept on its own row

Revision ID: 0002
Revises: 0001

Until 0001 these were ``meta`` keys named after the instance (``watchdog:<id>``, ``reaper:<id>``,
...), written once per instance and never removed. They are dropped here: each is re-learnt at the
next look (the watchdog record at the next arm).
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("memory", sa.Text(), nullable=True))
    op.execute("DELETE FROM meta WHERE key LIKE 'watchdog:%' OR key LIKE 'watchdog-seen:%' "
               "OR key LIKE 'reaper-busy:%' OR (key LIKE 'reaper:%' AND key NOT IN ('reaper:last_pass', "
               "'reaper:schedule'))")


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("memory")
