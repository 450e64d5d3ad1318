"""Writing files so that a killed process never leaves a half-written one behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path, data, mode: int = 0o644) -> Path:
    """Write ``data`` (bytes or str) to ``path`` through a temporary file in the same folder
    and a rename; the folder is created if needed."""
    path = Path(path)
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
