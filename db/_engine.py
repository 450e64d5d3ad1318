"""One engine and session helper per database URL; Alembic upgrades on connect.

``connect(url)`` opens a database for writing: it creates a SQLite file that does not exist yet
(its folder must), rolls back what a writer that stopped left unfinished (a hot journal), and
upgrades an older schema in place. ``connect(url, read_only=True)`` is for commands that only
read (best, export, report, regress's checks): it never creates or alters anything. A SQLite
file is copied into memory through SQLite's backup API inside one read transaction of a
read-only connection, so a read beside a live writer sees one consistent state; an older schema
is upgraded in that copy; a missing or empty file is an error that names the path; the
``-wal``/``-shm`` files a read-only connection has to make are removed again.

Both wait for another process's lock up to :func:`lock_timeout` seconds (``--lock-timeout``,
``$NF4TUNE_LOCK_TIMEOUT``, default 30), with a progress line after 2 s, and then raise
:class:`DatabaseLocked`. A hot journal, which only a connection that may write can roll back,
makes a read raise :class:`UnfinishedTransaction`.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
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
#: the first 16 bytes of a SQLite database file, and of a rollback journal that holds a transaction
SQLITE_HEADER = b"SQLite format 3\x00"
_JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")
#: how long a command waits for another process's lock by default (seconds)
LOCK_TIMEOUT_S = 30.0
#: when the first progress line of such a wait is printed, and how often the next ones
PROGRESS_AFTER_S = 2.0
PROGRESS_EVERY_S = 10.0
_lock_timeout_setting: list = []

#: database dialect -> the package that provides its driver
_DRIVERS = {"postgresql": "psycopg[binary] (or psycopg2-binary)", "postgresql+psycopg": "psycopg[binary]",
            "postgresql+psycopg2": "psycopg2-binary", "mysql": "mysqlclient", "mysql+pymysql": "pymysql",
            "mysql+mysqldb": "mysqlclient", "mariadb": "mariadb", "oracle": "oracledb", "mssql": "pyodbc"}


class DatabaseError(RuntimeError):
    """The database cannot be opened, read or upgraded."""


class DatabaseLocked(DatabaseError):
    """Another process held a lock on the database for longer than the lock timeout."""


class UnfinishedTransaction(DatabaseError):
    """A writer stopped in the middle of a transaction, and only a writing command can roll it back."""


def locked_message(what: str, waited: float) -> str:
    return f"database {what} is locked by another process (waited {waited:g} s)"


def lock_timeout() -> float:
    """Seconds to wait for another process's lock: the innermost :func:`lock_timeout_setting`,
    else ``$NF4TUNE_LOCK_TIMEOUT``, else :data:`LOCK_TIMEOUT_S`."""
    if _lock_timeout_setting:
        return _lock_timeout_setting[-1]
    text = os.environ.get("NF4TUNE_LOCK_TIMEOUT", "").strip()
    if not text:
        return LOCK_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise DatabaseError(f"NF4TUNE_LOCK_TIMEOUT={text!r} is not a number of seconds") from None
    if not value > 0:
        raise DatabaseError(f"NF4TUNE_LOCK_TIMEOUT={text!r} must be greater than 0")
    return value


@contextmanager
def lock_timeout_setting(seconds: Optional[float]) -> Iterator[None]:
    """Inside, :func:`lock_timeout` is ``seconds`` (None: unchanged), also for the processes
    started meanwhile (``$NF4TUNE_LOCK_TIMEOUT``)."""
    if seconds is None:
        yield
        return
    old = os.environ.get("NF4TUNE_LOCK_TIMEOUT")
    _lock_timeout_setting.append(float(seconds))
    os.environ["NF4TUNE_LOCK_TIMEOUT"] = repr(float(seconds))
    try:
        yield
    finally:
        _lock_timeout_setting.pop()
        if old is None:
            os.environ.pop("NF4TUNE_LOCK_TIMEOUT", None)
        else:
            os.environ["NF4TUNE_LOCK_TIMEOUT"] = old


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
        storage = optuna.storages.RDBStorage(self.url, engine_kwargs=engine_kwargs(self.url))
        bound_lock_waits(storage.engine)
        return storage

    def dispose(self):
        self.engine.dispose()


def engine_kwargs(url: str) -> dict:
    """Engine arguments for another engine on ``url`` (optuna's storage) that waits for SQLite's
    locks as :func:`make_engine`'s does (for PostgreSQL see :func:`bound_lock_waits`)."""
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": lock_timeout()}}
    return {"pool_pre_ping": True}


def bound_lock_waits(engine: Engine) -> Engine:
    """PostgreSQL: every new connection of ``engine`` waits for another session's lock up to
    :func:`lock_timeout` (``SET lock_timeout``, committed; no startup option, which a pooler may
    refuse); connections already pooled are let go. Other databases: unchanged."""
    if not engine.url.drivername.startswith("postgresql"):
        return engine
    ms = max(1, int(lock_timeout() * 1000))

    @event.listens_for(engine, "connect")
    def _pg_lock_timeout(dbapi_conn, _record):
        cur = dbapi_conn.cursor()
        cur.execute(f"SET lock_timeout = {ms}")
        cur.close()
        dbapi_conn.commit()

    engine.dispose()
    return engine


def make_engine(url: str) -> Engine:
    """An engine on ``url`` whose statements wait for another process's lock up to
    :func:`lock_timeout` (SQLite's busy timeout, PostgreSQL's ``lock_timeout``); SQLite in WAL mode."""
    kwargs = {}
    timeout = lock_timeout()
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": timeout}
    engine = bound_lock_waits(create_engine(url, future=True, **kwargs))
    if url.startswith("sqlite"):
        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
    return engine


def _driver_hint(url: str, err: BaseException) -> str:
    scheme = url.split("://", 1)[0]
    package = _DRIVERS.get(scheme) or _DRIVERS.get(scheme.split("+", 1)[0])
    what = f"pip install {package}" if package else "install the driver this URL names"
    return f"cannot open {url}: its database driver is not installed ({type(err).__name__}: {err}); {what}"


# ------------------------------------------------------------------ waiting for another process's lock
class _Busy(Exception):
    """One attempt found the database locked by another process."""


def _stderr_note(line: str) -> None:
    print(f"nf4-tune: {line}", file=sys.stderr, flush=True)


def _wait_for(attempt, what: str, timeout: float, note) -> object:
    """``attempt(slice_s)`` until it does not raise :class:`_Busy` (it may block up to
    ``slice_s`` itself); a progress line through ``note`` after :data:`PROGRESS_AFTER_S` and
    then every :data:`PROGRESS_EVERY_S`; :class:`DatabaseLocked` once ``timeout`` seconds passed."""
    t0 = time.monotonic()
    next_note = PROGRESS_AFTER_S
    while True:
        elapsed = time.monotonic() - t0
        slice_s = max(0.0, min(timeout - elapsed, next_note - elapsed))
        try:
            return attempt(slice_s)
        except _Busy:
            pass
        elapsed = time.monotonic() - t0
        if elapsed >= timeout:
            raise DatabaseLocked(locked_message(what, timeout))
        if elapsed >= next_note:
            (note or _stderr_note)(f"waiting for {what}: it is locked by another process ({elapsed:.0f} s of at most "
                                   f"{timeout:g} s; --lock-timeout)")
            next_note += PROGRESS_EVERY_S
        time.sleep(min(0.05, max(0.0, timeout - elapsed)))    # a lock SQLite reports at once


def _sqlite_code(e: BaseException) -> Optional[int]:
    code = getattr(e, "sqlite_errorcode", None)
    if code is None and isinstance(e, sqlite3.Error):        # Python 3.10: the message only
        text = str(e).lower()
        if "locked" in text or "busy" in text:
            return 5
    return code


def _is_busy(e: BaseException) -> bool:
    code = _sqlite_code(e)
    return code is not None and code & 0xFF in (5, 6)        # SQLITE_BUSY, SQLITE_LOCKED


def _journal_is_live(path: str) -> bool:
    """Whether ``path-journal`` holds a transaction (a non-empty rollback journal whose header is
    not zeroed): a live writer's, or a hot journal when its writer stopped."""
    try:
        with open(path + "-journal", "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return head == _JOURNAL_MAGIC


def _unfinished_message(path: str) -> str:
    return (f"{path} has an unfinished transaction from a writer that stopped ({path}-journal); any writing command, "
            f"e.g. nf4-tune db recover {path}, rolls it back")


def _read_only_medium(path: str) -> bool:
    try:
        return bool(os.statvfs(os.path.dirname(os.path.abspath(path)) or ".").f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def _remove_created_sidecars(abspath: str, before: set) -> None:
    """Remove the ``-wal``/``-shm`` files a read-only connection created (they were not there
    before the read), the way SQLite removes them: the last connection to close takes the
    database's exclusive lock, checkpoints the (empty) log and deletes both. A connection that
    may write does that; it reads nothing but the schema (``query_only``), and when another
    process has the database open it gets no exclusive lock and leaves the files to that
    process, whose own close removes them."""
    created = [s for s in ("-wal", "-shm") if s not in before and os.path.exists(abspath + s)]
    if not created or os.path.exists(abspath + "-journal"):
        return
    try:
        c = sqlite3.connect(f"file:{quote(abspath)}?mode=rw", uri=True, timeout=0, isolation_level=None)
    except sqlite3.Error:
        return
    try:
        c.execute("PRAGMA query_only=1")
        c.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error:
        pass
    finally:
        c.close()


def _sqlite_snapshot(path: str, timeout: float, note=None) -> Engine:
    """An in-memory copy of the SQLite file at ``path`` taken with SQLite's backup API inside one
    read transaction of a read-only connection (a consistent view beside a live writer), waiting
    up to ``timeout`` seconds for another process's lock. ``immutable`` only for a database with
    no journal and no write-ahead log on a read-only medium. A hot journal (a writer that
    stopped mid-transaction) cannot be rolled back here: :class:`UnfinishedTransaction`. The
    sidecar files the read made are removed (:func:`_remove_created_sidecars`)."""
    abspath = os.path.abspath(path)
    try:
        with open(abspath, "rb") as f:
            header = f.read(100)
    except OSError as e:
        raise DatabaseError(f"cannot open database {path}: {e.strerror or e}") from None
    if not header.startswith(SQLITE_HEADER):
        raise DatabaseError(f"cannot open database {path}: it is not a SQLite database (no SQLite header)")
    before = {s for s in ("-wal", "-shm", "-journal") if os.path.exists(abspath + s)}
    immutable = _read_only_medium(abspath) and not before & {"-wal", "-journal"}
    uri = f"file:{quote(abspath)}?mode=ro" + ("&immutable=1" if immutable else "")
    try:
        src = sqlite3.connect(uri, uri=True, timeout=0, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as e:
        raise DatabaseError(f"cannot open database {path}: {e}") from None
    dst = None
    try:
        def begin_read(slice_s: float):
            src.execute(f"PRAGMA busy_timeout={int(slice_s * 1000)}")
            try:
                src.execute("BEGIN")
                src.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.OperationalError as e:
                if src.in_transaction:
                    src.execute("ROLLBACK")
                if _is_busy(e):
                    raise _Busy() from None
                raise

        _wait_for(begin_read, path, timeout, note)
        dst = sqlite3.connect(":memory:", check_same_thread=False)
        src.backup(dst)                 # under the read transaction: never busy, never a torn copy
        src.execute("COMMIT")
    except sqlite3.Error as e:
        if dst is not None:
            dst.close()
        code = _sqlite_code(e)
        if code == 776 or (code is None and "readonly" in str(e) and _journal_is_live(abspath)):
            raise UnfinishedTransaction(_unfinished_message(path)) from None    # SQLITE_READONLY_ROLLBACK
        if code == 264:                 # SQLITE_READONLY_RECOVERY
            raise UnfinishedTransaction(f"{path} has a write-ahead log ({path}-wal) from a writer that stopped, which "
                                        f"this process may not recover; any writing command, e.g. nf4-tune db "
                                        f"recover {path}, folds it in") from None
        raise DatabaseError(f"cannot open database {path}: {e}") from None
    finally:
        src.close()
        _remove_created_sidecars(abspath, before)
    return create_engine("sqlite://", creator=lambda: dst, poolclass=StaticPool, future=True)


def _wait_for_sqlite_write(path: str, timeout: float, note=None, announce: bool = True) -> bool:
    """Wait up to ``timeout`` seconds until this process could take SQLite's write lock on
    ``path`` (made when missing), then let it go. Taking it rolls back a hot journal that a
    writer which stopped left: True when that happened."""
    abspath = os.path.abspath(path)
    hot = _journal_is_live(abspath)
    try:
        c = sqlite3.connect(abspath, timeout=0, isolation_level=None)
    except sqlite3.Error as e:
        raise DatabaseError(f"cannot open database {path}: {e}") from None
    try:
        def take(slice_s: float):
            c.execute(f"PRAGMA busy_timeout={int(slice_s * 1000)}")
            try:
                c.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as e:
                if _is_busy(e):
                    raise _Busy() from None
                raise
            c.execute("ROLLBACK")

        _wait_for(take, path, timeout, note)
    except sqlite3.Error as e:
        raise DatabaseError(f"cannot open database {path}: {e}") from None
    finally:
        c.close()
    rolled_back = hot and not _journal_is_live(abspath)
    if rolled_back and announce:
        (note or _stderr_note)(f"rolled back the unfinished transaction of a writer that stopped ({path}-journal)")
    return rolled_back


def _pg_lock_code(e: BaseException) -> bool:
    orig = getattr(e, "orig", e)
    return getattr(orig, "sqlstate", None) == "55P03" or getattr(orig, "pgcode", None) == "55P03"


def _wait_for_server_tables(engine: Engine, what: str, timeout: float, note, write: bool) -> None:
    """PostgreSQL: wait up to ``timeout`` seconds until no other session holds a lock on one of
    the database's tables that would block this command (an exclusive lock blocks a read, a
    share lock a write)."""
    from sqlalchemy import inspect
    from sqlalchemy.exc import OperationalError

    with engine.connect() as c:
        tables = inspect(c).get_table_names()
    if not tables:
        return
    names = ", ".join('"' + t.replace('"', '""') + '"' for t in tables)
    mode = "ROW EXCLUSIVE" if write else "ACCESS SHARE"

    def take(slice_s: float):
        try:
            with engine.connect() as c, c.begin():
                c.execute(text(f"SET LOCAL lock_timeout = {max(1, int(slice_s * 1000))}"))
                c.execute(text(f"LOCK TABLE {names} IN {mode} MODE"))
        except OperationalError as e:
            if _pg_lock_code(e):
                raise _Busy() from None
            raise
        except SQLAlchemyError:
            pass        # no privilege to lock a table (a read-only role): the statements wait on their own

    _wait_for(take, what, timeout, note)


def is_lock_error(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it was raised from) is another process's lock that outlasted
    the wait: SQLite's busy or locked, PostgreSQL's lock timeout."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DatabaseLocked) or _is_busy(e) or _pg_lock_code(e):
            return True
        orig = getattr(e, "orig", None)
        if orig is not None and (_is_busy(orig) or _pg_lock_code(orig)):
            return True
        e = e.__cause__ or e.__context__
    return False


def is_database_error(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it was raised from) came from the database or its driver."""
    from sqlalchemy.exc import SQLAlchemyError

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (SQLAlchemyError, sqlite3.Error)) or type(e).__module__.startswith(("psycopg", "optuna.storages")):
            return True
        e = e.__cause__ or e.__context__
    return False


def _shown(url: str) -> str:
    """``url`` as messages show it: a SQLite file's path, a server URL without its password."""
    path = sqlite_path(url)
    if path is not None:
        return path
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def connect(url: Optional[str] = None, upgrade_schema: bool = True, read_only: bool = False,
            timeout: Optional[float] = None, note=None) -> Database:
    """Open the database at ``url`` (see the module docstring for what ``read_only`` promises).
    ``timeout``: seconds to wait for another process's lock (default :func:`lock_timeout`);
    ``note(line)`` gets the progress lines of that wait (default: stderr)."""
    url = resolve_url(url)
    path = sqlite_path(url)
    timeout = lock_timeout() if timeout is None else timeout
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
            engine = _sqlite_snapshot(path, timeout, note)
        else:
            if path is not None:
                _wait_for_sqlite_write(path, timeout, note)
            engine = make_engine(url)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        if path is None and engine.url.drivername.startswith("postgresql"):
            _wait_for_server_tables(engine, _shown(url), timeout, note, write=not read_only)
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
        if is_lock_error(e):
            raise DatabaseLocked(locked_message(_shown(url), timeout)) from None
        raise DatabaseError(f"cannot open database {url}: {str(e).splitlines()[0]}") from None
    return Database(url, engine, read_only=read_only)


def recover(url: str, timeout: Optional[float] = None, note=None) -> dict:
    """Bring the SQLite file at ``url`` to a clean state, as any writing connection would: roll
    back the unfinished transaction of a writer that stopped (a hot journal), fold a write-ahead
    log into the file, and run SQLite's integrity check. Never creates a database. Returns
    ``rolled_back`` (bool), ``wal_frames`` (frames folded in, or None when not in WAL mode),
    ``wal_busy`` (a reader kept part of the log) and ``integrity`` (the check's lines, ``["ok"]``
    when intact)."""
    url = resolve_url(url)
    path = sqlite_path(url)
    if path is None:
        raise DatabaseError(f"{_shown(url)} is not a SQLite file: its server rolls back an unfinished transaction "
                            "itself, nothing to recover here")
    p = Path(path)
    if not p.is_file():
        raise DatabaseError(f"no database at {path}" if not p.exists() else f"{path} is not a database file")
    with open(p, "rb") as f:
        if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
            raise DatabaseError(f"{path} is not a SQLite database (no SQLite header)")
    timeout = lock_timeout() if timeout is None else timeout
    rolled_back = _wait_for_sqlite_write(path, timeout, note, announce=False)
    c = sqlite3.connect(os.path.abspath(path), timeout=timeout, isolation_level=None)
    try:
        mode = c.execute("PRAGMA journal_mode").fetchone()[0].lower()
        frames, busy = None, False
        if mode == "wal":
            blocked, log, done = c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            frames, busy = max(done, 0), bool(blocked)
        integrity = [r[0] for r in c.execute("PRAGMA integrity_check(20)")]
    except sqlite3.Error as e:
        if _is_busy(e):
            raise DatabaseLocked(locked_message(path, timeout)) from None
        raise DatabaseError(f"cannot recover {path}: {e}") from None
    finally:
        c.close()
    return dict(rolled_back=rolled_back, wal_frames=frames, wal_busy=busy, integrity=integrity)
