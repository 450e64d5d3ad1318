"""One engine and session helper per database URL; Alembic upgrades on connect."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

DEFAULT_URL = "sqlite:///nf4tune.db"
#: our own Alembic version table: optuna's storage, which shares the database, uses alembic_version
VERSION_TABLE = "nf4tune_schema_version"
_MIGRATIONS = Path(__file__).with_name("migrations")


class DatabaseError(RuntimeError):
    """The database cannot be opened, read or upgraded."""


def resolve_url(url: Optional[str] = None) -> str:
    """``url``, else ``$NF4TUNE_DB``, else ``./nf4tune.db``; a bare path means a SQLite file."""
    url = url or os.environ.get("NF4TUNE_DB") or DEFAULT_URL
    if "://" not in url:
        url = f"sqlite:///{url}"
    return url


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


def current_revision(engine: Engine) -> Optional[str]:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


class Database:
    """An engine, its session factory and its URL."""

    def __init__(self, url: str, engine: Engine):
        self.url = url
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session that commits on success and rolls back on error."""
        s = self._sessions()
        try:
            yield s
            s.commit()
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

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


def connect(url: Optional[str] = None, upgrade_schema: bool = True) -> Database:
    """Open (creating or upgrading as needed) the database at ``url``."""
    url = resolve_url(url)
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if path and path != ":memory:":
            parent = Path(path).resolve().parent
            if not parent.exists():
                raise DatabaseError(f"cannot open {url}: folder {parent} does not exist")
    try:
        engine = make_engine(url)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        if upgrade_schema:
            upgrade(engine)
    except SQLAlchemyError as e:
        raise DatabaseError(f"cannot open database {url}: {str(e).splitlines()[0]}") from None
    return Database(url, engine)
