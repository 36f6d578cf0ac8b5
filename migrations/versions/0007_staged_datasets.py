"""staged datasets: what orch staged on each volume, kept at home (``ledger_volumes.StagedDataset``)

Revision ID: 0007
Revises: 0006

A dataset staged on a volume is reused by the next job that mounts it, and anything that mounts the
volume can write there meanwhile. Its record (every file's size and SHA-256, which file is its
data.yaml) lives here, in the ledger, not beside it on the volume: reuse is checked against this.
"""
import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

S = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table(
        "staged_datasets",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("volume_id", S(length=12), sa.ForeignKey("volumes.id"), nullable=False),
        sa.Column("name", S(length=64), nullable=False),
        sa.Column("tar_sha256", S(length=64), nullable=False),
        sa.Column("data_yaml", sa.Text(), nullable=False),
        sa.Column("files", sa.Text(), nullable=False),
        sa.Column("manifest_sha256", S(length=64), nullable=False),
        sa.Column("staged_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("volume_id", "name", name="uq_staged_datasets_volume_name"),
    )
    op.create_index("ix_staged_datasets_volume_id", "staged_datasets", ["volume_id"])


def downgrade() -> None:
    op.drop_table("staged_datasets")
