"""flags: the nightly verdict per problem of each regress run

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "flags",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), nullable=False, index=True),
        sa.Column("measurement_id", sa.Integer, sa.ForeignKey("measurements.id"), nullable=True),
        sa.Column("shape", sa.String(64), nullable=False),
        sa.Column("dtype", sa.String(8), nullable=False),
        sa.Column("quant", sa.String(8), nullable=False),
        sa.Column("blocksize", sa.Integer, nullable=False),
        sa.Column("flag", sa.String(32), nullable=False),
        sa.Column("speedup", sa.Float, nullable=True),
        sa.Column("baseline_speedup", sa.Float, nullable=True),
        sa.Column("drop", sa.Float, nullable=True),
        sa.Column("threshold", sa.Float, nullable=True),
        sa.Column("p_value", sa.Float, nullable=True),
        sa.Column("changes", sa.JSON, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )


def downgrade():
    op.drop_table("flags")
