"""measurements.registers: the variant's register count beside each measurement

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("registers", sa.Integer, nullable=True))


def downgrade():
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("registers")
