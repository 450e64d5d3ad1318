"""initial schema: gpus, environments, kernel_configs, runs, measurements

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "gpus",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("compute_capability", sa.String(16), nullable=False),
        sa.Column("sm_count", sa.Integer, nullable=False),
        sa.Column("memory_bytes", sa.BigInteger, nullable=False),
        sa.Column("l2_bytes", sa.BigInteger, nullable=False),
        sa.Column("copy_gbps", sa.Float, nullable=True),
        sa.UniqueConstraint("name", "compute_capability", "sm_count", "memory_bytes"),
    )
    op.create_table(
        "environments",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("project_version", sa.String(32), nullable=False),
        sa.Column("git_commit", sa.String(64), nullable=False),
        sa.Column("nvrtc", sa.String(32), nullable=False),
        sa.Column("driver", sa.String(32), nullable=False),
        sa.Column("cuda_python", sa.String(32), nullable=False),
        sa.Column("bnb", sa.String(32), nullable=False),
        sa.Column("torch", sa.String(64), nullable=False),
        sa.UniqueConstraint("project_version", "git_commit", "nvrtc", "driver", "cuda_python", "bnb", "torch"),
    )
    op.create_table(
        "kernel_configs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("knobs", sa.Text, nullable=False),
        sa.Column("template_hash", sa.String(64), nullable=False),
        sa.UniqueConstraint("knobs", "template_hash"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("ended_at", sa.DateTime, nullable=True),
        sa.Column("environment_id", sa.Integer, sa.ForeignKey("environments.id"), nullable=False),
        sa.Column("gpu_id", sa.Integer, sa.ForeignKey("gpus.id"), nullable=False),
        sa.Column("command", sa.Text, nullable=False),
    )
    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id"), nullable=False, index=True),
        sa.Column("config_id", sa.Integer, sa.ForeignKey("kernel_configs.id"), nullable=True, index=True),
        sa.Column("label", sa.String(128), nullable=False),
        sa.Column("shape", sa.String(64), nullable=False),
        sa.Column("dtype", sa.String(8), nullable=False),
        sa.Column("quant", sa.String(8), nullable=False),
        sa.Column("blocksize", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("samples_us", sa.JSON, nullable=False),
        sa.Column("median_us", sa.Float, nullable=True),
        sa.Column("iqr_us", sa.Float, nullable=True),
        sa.Column("gbps", sa.Float, nullable=True),
        sa.Column("pct_copy", sa.Float, nullable=True),
        sa.Column("bnb_median_us", sa.Float, nullable=True),
        sa.Column("speedup", sa.Float, nullable=True),
        sa.Column("sm_clock_mhz", sa.Integer, nullable=True),
        sa.Column("mem_clock_mhz", sa.Integer, nullable=True),
        sa.Column("temperature_c", sa.Integer, nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )


def downgrade():
    for t in ("measurements", "runs", "kernel_configs", "environments", "gpus"):
        op.drop_table(t)
