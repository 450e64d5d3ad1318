"""One engine and session helper per database URL; Alembic upgrades on connect.

``connect(url)`` opens a database for writing: it creates a SQLite file that does not exist yet
(its folder must) and upgrades an older schema in place. ``connect(url, read_only=True)`` is
for commands that only read (best, export, report, regress's checks): it never creates or
alters anything. A SQLite file is copied into memory through SQLite's backup API (opened
immutable, or read-only when a write-ahead log holds data), and an older schema is upgraded in
that copy; a missing or empty file is an error that names the path.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import quote

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

DEFAULT_URL = "sqlite:///nf4tune.db"
#: our own Alembic version table: optuna's storage, which shares the database, uses alembic_version
VERSION_TABLE = "nf4tune_schema_version"
_MIGRATIONS = Path(__file__).with_name("migrations")

#: database dialect -> the package that provides its driver
_DRIVERS = {"postgresql": "psycopg[binary] (or psycopg2-binary)", "postgresql+psycopg": "psycopg[binary]",
            "postgresql+psycopg2": "psycopg2-binary", "mysql": "mysqlclient", "mysql+pymysql": "pymysql",
            "mysql+mysqldb": "mysqlclient", "mariadb": "mariadb", "oracle": "oracledb", "mssql": "pyodbc"}


class DatabaseError(RuntimeError):
    """The database cannot be opened, read or upgraded."""


def resolve_url(url: Optional[str] = None) -> str:
    """``url``, else ``$NF4TUNE_DB``, else ``./nf4tune.db``; a bare path means a SQLite file."""
    url = url or os.environ.get("NF4TUNE_DB") or DEFAULT_URL
    if "://" not in url:
        url = f"sqlite:///{url}"
    return url


def sqlite_path(url: str) -> Optional[str]:
    """The file of a SQLite URL (None for other databases and for in-memory SQLite)."""
    if not url.startswith("sqlite"):
        return None
    path = url.split("///", 1)[1] if "///" in url else ""
    if not path or path == ":memory:" or path.startswith("file:"):
        return None
    return path.split("?", 1)[0]


def _alembic_config(connection):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision`` in place (never drops data)."""
    from alembic import command

    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), revision)


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    cfg = _alembic_config(None)
    return ScriptDirectory.from_config(cfg).get_current_head()


def current_revision(engine: Engine) -> Optional[str]:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


class Database:
    """An engine, its session factory and its URL."""

    def __init__(self, url: str, engine: Engine, read_only: bool = False):
        self.url = url
        self.engine = engine
        self.read_only = read_only
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits on success and rolls back on error."""
        s = self._sessions()
        try:
            yield s
            if not self.read_only:      # read-only: nothing to commit; close() keeps loaded values
                s.commit()
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    def optuna_storage(self):
        """optuna's storage on this database: the same engine's data, read-only ones never
        creating optuna's tables. None when the database holds no optuna tables and is read-only."""
        import optuna
        from sqlalchemy import inspect

        if self.read_only:
            with self.engine.connect() as c:
                if "studies" not in inspect(c).get_table_names():
                    return None
            if self.engine.url.drivername.startswith("sqlite") and self.engine.pool.__class__ is StaticPool:
                conn = self.engine.raw_connection().driver_connection
                return optuna.storages.RDBStorage("sqlite://", skip_table_creation=True,
                                                  skip_compatibility_check=True,
                                                  engine_kwargs={"creator": lambda: conn, "poolclass": StaticPool})
            return optuna.storages.RDBStorage(self.url, skip_table_creation=True, skip_compatibility_check=True)
        kwargs = {"connect_args": {"timeout": 60}} if self.url.startswith("sqlite") else {"pool_pre_ping": True}
        return optuna.storages.RDBStorage(self.url, engine_kwargs=kwargs)

    def dispose(self):
        self.engine.dispose()


def make_engine(url: str) -> Engine:
    kwargs = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 60}
    engine = create_engine(url, future=True, **kwargs)
    if url.startswith("sqlite"):
        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
    return engine


def _driver_hint(url: str, err: BaseException) -> str:
    scheme = url.split("://", 1)[0]
    package = _DRIVERS.get(scheme) or _DRIVERS.get(scheme.split("+", 1)[0])
    what = f"pip install {package}" if package else "install the driver this URL names"
    return f"cannot open {url}: its database driver is not installed ({type(err).__name__}: {err}); {what}"


def _sqlite_snapshot(path: str) -> Engine:
    """An in-memory copy of the SQLite file at ``path``, read without creating or changing a file."""
    wal = Path(path + "-wal")
    mode = "ro" if wal.exists() and wal.stat().st_size > 0 else "ro&immutable=1"
    try:
        src = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode={mode}", uri=True)
        dst = sqlite3.connect(":memory:", check_same_thread=False)
        try:
            src.backup(dst)
        finally:
            src.close()
    except sqlite3.Error as e:
        raise DatabaseError(f"cannot open database {path}: {e}") from None
    engine = create_engine("sqlite://", creator=lambda: dst, poolclass=StaticPool, future=True)
    return engine


def connect(url: Optional[str] = None, upgrade_schema: bool = True, read_only: bool = False) -> Database:
    """Open the database at ``url`` (see the module docstring for what ``read_only`` promises)."""
    url = resolve_url(url)
    path = sqlite_path(url)
    if path is not None:
        p = Path(path)
        if read_only:
            if not p.exists():
                raise DatabaseError(f"no database at {path} (a command that only reads never creates one; "
                                    "check the path or run `nf4-tune search` to make one)")
            if not p.is_file():
                raise DatabaseError(f"{path} is not a database file")
            if p.stat().st_size == 0:
                raise DatabaseError(f"{path} is empty (0 bytes), not an nf4-tune database")
        else:
            parent = p.resolve().parent
            if not parent.exists():
                raise DatabaseError(f"cannot open {url}: folder {parent} does not exist")
            if p.exists() and not p.is_file():
                raise DatabaseError(f"cannot open {url}: {path} is not a file")
    try:
        if read_only and path is not None:
            engine = _sqlite_snapshot(path)
        else:
            engine = make_engine(url)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        if read_only:
            rev = current_revision(engine)
            if rev is None:
                raise DatabaseError(f"{path or url} holds no nf4-tune schema (is it an nf4-tune database?)")
            if rev != head_revision():
                if path is None:
                    raise DatabaseError(f"{url} has schema {rev}, older than {head_revision()}: run a writing command "
                                        "(`nf4-tune search` or `nf4-tune bench`) once to upgrade it")
                upgrade(engine)          # the in-memory copy only
        elif upgrade_schema:
            upgrade(engine)
    except (NoSuchModuleError, ModuleNotFoundError, ImportError) as e:
        raise DatabaseError(_driver_hint(url, e)) from None
    except ArgumentError as e:
        raise DatabaseError(f"cannot open {url}: not a database URL ({e})") from None
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot open database {url}: {str(e).splitlines()[0]}") from None
    return Database(url, engine, read_only=read_only)
