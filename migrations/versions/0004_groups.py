"""node groups: an instance's group and rank, its private address, and a job's node count

Revision ID: 0004
Revises: 0003

`orch up NAME --nodes N` and `orch run NAME --nodes N` rent N instances as one group: each node is
an ordinary ``instances`` row (so every existing path sees it: sync, reaper, cost, reconcile) that
also says which group it belongs to (``group_id``: one per bring-up, so a group name used again
later is another group), the group's name, its rank (0 is the head, where the rendezvous listens)
and the group's size, and the private address the other nodes reach it at. A job records how many
nodes each of its attempts rents.
"""
import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

S = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("group_id", S(length=12), nullable=True))
        batch.add_column(sa.Column("group_name", S(length=64), nullable=True))
        batch.add_column(sa.Column("node_rank", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("group_size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("private_ip", S(length=64), nullable=True))
    op.create_index("ix_instances_group_id", "instances", ["group_id"])
    op.create_index("ix_instances_group_name", "instances", ["group_name"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("nodes", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("nodes")
    op.drop_index("ix_instances_group_name", "instances")
    op.drop_index("ix_instances_group_id", "instances")
    with op.batch_alter_table("instances") as batch:
        for column in ("private_ip", "group_size", "node_rank", "group_name", "group_id"):
            batch.drop_column(column)
