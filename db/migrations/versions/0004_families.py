"""families: the kernel family and the batch bucket (m) of every measurement, flag and config

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade():
    for table in ("measurements", "flags"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("family", sa.String(32), nullable=False, server_default="dequant"))
            batch.add_column(sa.Column("m", sa.Integer, nullable=True))
    with op.batch_alter_table("kernel_configs") as batch:
        batch.add_column(sa.Column("family", sa.String(32), nullable=False, server_default="dequant"))
    op.create_index("ix_measurements_problem", "measurements", ["family", "shape", "dtype", "quant", "blocksize", "m"])


def downgrade():
    op.drop_index("ix_measurements_problem", "measurements")
    with op.batch_alter_table("kernel_configs") as batch:
        batch.drop_column("family")
    for table in ("measurements", "flags"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("m")
            batch.drop_column("family")
