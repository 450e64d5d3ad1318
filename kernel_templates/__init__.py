"""The templated CUDA sources of nf4-tune.

A family's variant is one translation unit joined from a few files of this folder: the shared
headers (``codes.cuh``: the 16-entry NF4/FP4 code; ``matmul/common.cuh``: what every matmul
structure shares) and the one structure file its config selects (``dequant.cu``,
``matmul/simt.cu``, ``matmul/mma_rows.cu``, ...). Each file's header says what its structure does
and what each of its knobs changes. :func:`render` writes the knob macros (values as the family
declaration in ``tuner/families/`` gives them, an enum knob's values as named constants) and
then the files, in order, as ONE text: the compile cache hashes that text.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Iterable, Optional, Union

__all__ = ["render", "template_hash", "template_source", "templates"]

#: what a template file may be called
SUFFIXES = (".cu", ".cuh")


def _root(root: Optional[Union[str, Path]]):
    return Path(root) if root is not None else resources.files(__name__)


@lru_cache(maxsize=None)
def templates(root: Optional[str] = None) -> tuple:
    """Every template file under the folder (this package's unless ``root`` is given), as paths
    relative to it with ``/`` separators, sorted."""
    base = _root(root)
    found = []

    def walk(d, prefix):
        for entry in d.iterdir():
            if entry.is_dir() and not entry.name.startswith(("_", ".")):
                walk(entry, f"{prefix}{entry.name}/")
            elif entry.name.endswith(SUFFIXES):
                found.append(prefix + entry.name)

    walk(base, "")
    return tuple(sorted(found))


@lru_cache(maxsize=None)
def _read(name: str, root: Optional[str]) -> str:
    if name not in templates(root):
        raise ValueError(f"unknown template {name!r}; known: {', '.join(templates(root))}")
    node = _root(root)
    for part in name.split("/"):
        node = node.joinpath(part)
    return node.read_text(encoding="utf-8")


def template_source(name: str, root: Optional[Union[str, Path]] = None) -> str:
    """The raw text of template file ``name`` (e.g. ``matmul/simt.cu``)."""
    return _read(name, None if root is None else str(root))


def _names(files: Union[str, Iterable[str]]) -> tuple:
    return (files,) if isinstance(files, str) else tuple(files)


def joined(files: Union[str, Iterable[str]], root: Optional[Union[str, Path]] = None) -> str:
    """The files' texts in order, each after a line naming it."""
    return "".join(f"// ---- kernel_templates/{name}\n" + template_source(name, root) for name in _names(files))


def template_hash(files: Union[str, Iterable[str]], root: Optional[Union[str, Path]] = None) -> str:
    """SHA-256 of the files' joined text: changes whenever any of their sources changes."""
    return hashlib.sha256(joined(files, root).encode()).hexdigest()


def render(files: Union[str, Iterable[str]], macros: dict, constants: Optional[dict] = None,
           root: Optional[Union[str, Path]] = None) -> str:
    """The CUDA source of ``files`` joined in order, after ``constants`` (name -> integer: the named
    values of the enum knobs) and ``macros`` (name -> integer, or the name of one of ``constants``)
    are defined."""
    constants = dict(constants or {})
    lines = ["// rendered by nf4-tune kernel_templates.render"]
    for name, value in constants.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"render: constant {name}={value!r} is not an integer")
        lines.append(f"#define {name} {value}")
    for macro, value in macros.items():
        if isinstance(value, str):
            if value not in constants:
                raise ValueError(f"render: macro {macro}={value!r} names no defined constant")
        elif not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"render: macro {macro}={value!r} is not an integer")
        lines.append(f"#define {macro} {value}")
    return "\n".join(lines) + "\n" + joined(files, root)
