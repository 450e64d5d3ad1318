"""Writing output files safely: atomically, to regular files only, never through a device file,
a directory or a path under a file; a symlink is followed to the regular file it names."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

__all__ = ["OutputPathError", "check_output_file", "check_output_dir", "atomic_write"]


class OutputPathError(ValueError):
    """An output path that cannot be written as a regular file (or a folder of them)."""


def _check_ancestors(path: Path) -> None:
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(f"cannot write {path}: {parent} is not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise OutputPathError(f"cannot write {path}: folder {parent} is not writable")
            return


def check_output_file(path) -> Path:
    """The regular file ``path`` stands for (a symlink followed to its target), checked so that
    writing it replaces nothing but a regular file. OutputPathError otherwise."""
    p = Path(path)
    if str(path) in ("", "-"):
        raise OutputPathError("an output file path is needed")
    if p.is_symlink():
        target = Path(os.path.realpath(p))
        if target.exists() and not target.is_file():
            raise OutputPathError(f"cannot write {p}: it links to {target}, which is not a regular file")
        p = target
    if p.exists():
        mode = p.stat().st_mode
        if stat.S_ISDIR(mode):
            raise OutputPathError(f"cannot write {p}: it is a folder (give a file name)")
        if not stat.S_ISREG(mode):
            raise OutputPathError(f"cannot write {p}: it is not a regular file (a device, socket or pipe)")
    _check_ancestors(p)
    return p


def check_output_dir(path) -> Path:
    """A folder to write files into: an existing folder, or one that can be made."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"cannot write into {p}: it is a file, not a folder")
    if not p.exists():
        _check_ancestors(p)
    elif not os.access(p, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot write into {p}: the folder is not writable")
    return p


def atomic_write(path, data, mode: int = 0o644) -> Path:
    """Write ``data`` (bytes or str) to the regular file ``path`` (checked by
    :func:`check_output_file`) through a temporary file in the same folder and a rename; the
    folder is created if needed."""
    path = check_output_file(path)
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
