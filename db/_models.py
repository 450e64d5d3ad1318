"""The tables (SQLAlchemy 2 declarative models). Schema changes go through an Alembic revision.

A problem (nf4tune.vocabulary.Problem) is stored as columns: family, shape ("4096x4096"), dtype,
quant, blocksize and m (the matmul family's batch bucket; NULL for dequant)."""

from __future__ import annotations

import datetime as dt
from typing import Optional

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class GPU(Base):
    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("name", "compute_capability", "sm_count", "memory_bytes"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    compute_capability: Mapped[str] = mapped_column(String(16))
    sm_count: Mapped[int] = mapped_column(Integer)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    l2_bytes: Mapped[int] = mapped_column(BigInteger)
    copy_gbps: Mapped[Optional[float]] = mapped_column(Float, nullable=True)


class Environment(Base):
    __tablename__ = "environments"
    __table_args__ = (UniqueConstraint("project_version", "git_commit", "nvrtc", "driver", "cuda_python", "bnb",
                                       "torch"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    project_version: Mapped[str] = mapped_column(String(32))
    git_commit: Mapped[str] = mapped_column(String(64))
    nvrtc: Mapped[str] = mapped_column(String(32))
    driver: Mapped[str] = mapped_column(String(32))
    cuda_python: Mapped[str] = mapped_column(String(32))
    bnb: Mapped[str] = mapped_column(String(32))
    torch: Mapped[str] = mapped_column(String(64))


class KernelConfigRow(Base):
    __tablename__ = "kernel_configs"
    __table_args__ = (UniqueConstraint("knobs", "template_hash"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    knobs: Mapped[str] = mapped_column(Text)            # canonical JSON (sorted keys)
    template_hash: Mapped[str] = mapped_column(String(64))
    family: Mapped[str] = mapped_column(String(32), default="dequant", server_default="dequant")


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))       # search, bench or regress
    started_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)
    ended_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime, nullable=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"))
    gpu_id: Mapped[int] = mapped_column(ForeignKey("gpus.id"))
    command: Mapped[str] = mapped_column(Text, default="")

    environment: Mapped[Environment] = relationship()
    gpu: Mapped[GPU] = relationship()


class Measurement(Base):
    __tablename__ = "measurements"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    config_id: Mapped[Optional[int]] = mapped_column(ForeignKey("kernel_configs.id"), nullable=True, index=True)
    label: Mapped[str] = mapped_column(String(128))     # the config's label, or a reference's name
    family: Mapped[str] = mapped_column(String(32), default="dequant", server_default="dequant")
    shape: Mapped[str] = mapped_column(String(64))      # "4096x4096"
    dtype: Mapped[str] = mapped_column(String(8))
    quant: Mapped[str] = mapped_column(String(8))
    blocksize: Mapped[int] = mapped_column(Integer)
    m: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)   # the matmul family's batch bucket
    status: Mapped[str] = mapped_column(String(16))     # ok, invalid, reference
    reason: Mapped[str] = mapped_column(Text, default="")
    samples_us: Mapped[list] = mapped_column(JSON, default=list)
    median_us: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    iqr_us: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    gbps: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    pct_copy: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    bnb_median_us: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    speedup: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    sm_clock_mhz: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    mem_clock_mhz: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    temperature_c: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    registers: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)

    run: Mapped[Run] = relationship()
    config: Mapped[Optional[KernelConfigRow]] = relationship()


class Flag(Base):
    """The nightly verdict of one problem in one regress run (see ``nf4tune.track.regression.judge``)."""

    __tablename__ = "flags"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    measurement_id: Mapped[Optional[int]] = mapped_column(ForeignKey("measurements.id"), nullable=True)
    family: Mapped[str] = mapped_column(String(32), default="dequant", server_default="dequant")
    shape: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(8))
    quant: Mapped[str] = mapped_column(String(8))
    blocksize: Mapped[int] = mapped_column(Integer)
    m: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    flag: Mapped[str] = mapped_column(String(32))       # one of nf4tune.vocabulary.FLAGS
    speedup: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    baseline_speedup: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    drop: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    threshold: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    p_value: Mapped[Optional[float]] = mapped_column(Float, nullable=True)
    changes: Mapped[dict] = mapped_column(JSON, default=dict)
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=_now)

    run: Mapped[Run] = relationship()
    measurement: Mapped[Optional[Measurement]] = relationship()
