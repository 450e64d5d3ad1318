"""Writing output files safely: atomically, to regular files only, never through a device file,
a directory or a path under a file, and never onto a database; a symlink is followed to the
regular file it names.

An output path is resolved first (every symlink followed) and refused when it is a database:
the database the command uses (``--db``, see :func:`protect_databases`), any SQLite file (its
first 16 bytes are ``SQLite format 3\\0``) or a SQLite sidecar (a name ending in ``-wal``,
``-shm`` or ``-journal``). A set of files (the HTML report) is written into a fresh temporary
folder beside the target folder and then only those files are moved into place
(:func:`publish_files`); a target name that exists as a symlink, a folder or anything but a
regular file is refused, and no other file of the folder is touched."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Mapping

__all__ = ["OutputPathError", "check_output_file", "check_output_dir", "atomic_write", "publish_files",
           "check_publish_targets", "protect_databases", "is_sqlite_file", "SQLITE_HEADER", "SIDECAR_SUFFIXES"]

#: the first 16 bytes of every SQLite database file
SQLITE_HEADER = b"SQLite format 3\x00"
#: SQLite's files beside a database: the write-ahead log, its index, the rollback journal
SIDECAR_SUFFIXES = ("-wal", "-shm", "-journal")

#: the database files of the running command (resolved paths): no output may land on them
_PROTECTED: list = []


class OutputPathError(ValueError):
    """An output path that cannot be written as a regular file (or a folder of them)."""


@contextlib.contextmanager
def protect_databases(paths: Iterable) -> Iterator[None]:
    """While inside, every output check also refuses the files ``paths`` (the command's
    databases, whether they exist yet or not)."""
    added = [os.path.realpath(p) for p in paths if p]
    _PROTECTED.extend(added)
    try:
        yield
    finally:
        for p in added:
            _PROTECTED.remove(p)


def is_sqlite_file(path) -> bool:
    """Whether the regular file ``path`` begins with SQLite's header (False when it is missing);
    OSError when it exists but cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except FileNotFoundError:
        return False


def _check_not_database(given: Path, target: Path, databases: Iterable = ()) -> None:
    """OutputPathError when writing ``target`` (``given`` resolved) would land on a database."""
    shown = f"{given}" if given == target else f"{given} (which is {target})"
    for name in (given.name, target.name):
        for suffix in SIDECAR_SUFFIXES:
            if name.endswith(suffix):
                raise OutputPathError(f"refusing to write {shown}: a name ending in {suffix} is a SQLite "
                                      "database's own file")
    for db in list(databases) + _PROTECTED:
        real = os.path.realpath(db)
        same = str(target) == real
        if not same and target.exists() and os.path.exists(real):
            try:
                same = os.path.samefile(target, real)
            except OSError:
                pass
        if same:
            raise OutputPathError(f"refusing to write {shown}: it is the database this command uses (--db)")
        if any(str(target) == real + s for s in SIDECAR_SUFFIXES):
            raise OutputPathError(f"refusing to write {shown}: it belongs to the database {db}")
    if target.is_file():
        try:
            sqlite = is_sqlite_file(target)
        except OSError as e:
            raise OutputPathError(f"refusing to write {shown}: cannot read it to check that it is no database "
                                  f"({e.strerror or e})") from None
        if sqlite:
            raise OutputPathError(f"refusing to write {shown}: it is a SQLite database")


def _check_ancestors(path: Path) -> None:
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(f"cannot write {path}: {parent} is not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise OutputPathError(f"cannot write {path}: folder {parent} is not writable")
            return


def check_output_file(path, databases: Iterable = ()) -> Path:
    """The regular file ``path`` stands for (every symlink followed), checked so that writing
    it replaces nothing but a regular file that is no database (see the module docstring;
    ``databases``: files to refuse besides those of :func:`protect_databases`).
    OutputPathError otherwise."""
    if str(path) in ("", "-"):
        raise OutputPathError("an output file path is needed")
    given = Path(path)
    p = Path(os.path.realpath(given))
    if given.is_symlink() and p.exists() and not p.is_file():
        raise OutputPathError(f"cannot write {given}: it links to {p}, which is not a regular file")
    if p.exists():
        mode = p.stat().st_mode
        if stat.S_ISDIR(mode):
            raise OutputPathError(f"cannot write {given}: it is a folder (give a file name)")
        if not stat.S_ISREG(mode):
            raise OutputPathError(f"cannot write {given}: it is not a regular file (a device, socket or pipe)")
    _check_not_database(given, p, databases)
    _check_ancestors(p)
    return p


def check_output_dir(path) -> Path:
    """A folder to write files into: an existing folder, or one that can be made."""
    p = Path(path)
    if p.is_symlink() and not p.exists():
        raise OutputPathError(f"cannot write into {p}: it is a link to {os.readlink(p)}, which does not exist")
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"cannot write into {p}: it is a file, not a folder")
    if not p.exists():
        _check_ancestors(p)
    elif not os.access(p, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write into {p}: the folder is not writable")
    return p


def atomic_write(path, data, mode: int = 0o644, databases: Iterable = ()) -> Path:
    """Write ``data`` (bytes or str) to the regular file ``path`` (checked by
    :func:`check_output_file`) through a temporary file in the same folder and a rename; the
    folder is created if needed."""
    path = check_output_file(path, databases)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def check_publish_targets(folder, names: Iterable[str], databases: Iterable = ()) -> Path:
    """Check that the files ``names`` can be published into ``folder`` (:func:`publish_files`):
    the folder is one (or can be made), and each name is absent or a regular file that is no
    database; a symlink, a folder or another kind of file under a name is refused.
    The resolved folder."""
    check_output_dir(folder)
    real = Path(os.path.realpath(folder))
    for name in names:
        target = real / name
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            continue
        what = ("a symlink" if stat.S_ISLNK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode)
                else None if stat.S_ISREG(st.st_mode) else "not a regular file")
        if what:
            raise OutputPathError(f"refusing to write into {folder}: {name} there is {what} (only regular files are "
                                  "replaced; move it away)")
        _check_not_database(Path(folder) / name, target, databases)
    return real


def publish_files(folder, files: Mapping[str, bytes], mode: int = 0o644, databases: Iterable = ()) -> list:
    """Write ``files`` (name -> bytes or str, in the order given; the last one last, e.g. the
    page that links the others) into ``folder``: all of them first into a fresh temporary folder
    beside ``folder`` (inside it when ``folder`` is a mount point of its own), then each moved into
    place by a rename, which replaces a regular file and never writes through a link. Every
    target is checked (:func:`check_publish_targets`) before anything is written and again just
    before the moves; other files of ``folder`` are never touched. The paths written."""
    check_publish_targets(folder, files, databases)
    given = Path(folder)
    given.mkdir(parents=True, exist_ok=True)
    real = Path(os.path.realpath(given))
    beside = real.parent
    if not os.access(beside, os.W_OK | os.X_OK) or os.stat(beside).st_dev != os.stat(real).st_dev:
        beside = real           # the rename must stay on one file system
    tmp = Path(tempfile.mkdtemp(dir=beside, prefix=f".{real.name}.tmp-"))
    try:
        for name, data in files.items():
            if isinstance(data, str):
                data = data.encode("utf-8")
            with open(tmp / name, "xb") as f:
                f.write(data)
            os.chmod(tmp / name, mode)
        check_publish_targets(given, files, databases)
        written = []
        for name in files:
            os.replace(tmp / name, real / name)
            written.append(given / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written
