"""Storage for nf4-tune: GPUs, environments, kernel configs, runs and measurements.

SQLAlchemy 2 models behind one session helper; a SQLite file by default (``./nf4tune.db``,
WAL mode), any SQLAlchemy URL (PostgreSQL) for a fleet. The schema is versioned with Alembic:
:func:`connect` upgrades an older database in place, it never drops one.
"""

from ._engine import DEFAULT_URL, Database, connect, resolve_url
from ._models import GPU, Base, Environment, Flag, KernelConfigRow, Measurement, Run
from ._repository import ENV_FIELDS, Repository

__all__ = ["DEFAULT_URL", "Database", "connect", "resolve_url", "Base", "GPU", "Environment", "KernelConfigRow",
           "Run", "Measurement", "Flag", "Repository", "ENV_FIELDS"]
