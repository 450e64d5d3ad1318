"""The templated CUDA sources of nf4-tune, one file per kernel family.

Each template's header says what each of its macros changes and why. :func:`render` turns a
family's macro values (written by the family declaration in ``tuner/families/``) into a
complete CUDA translation unit: the macro definitions, then the template.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources

__all__ = ["render", "template_hash", "template_source", "TEMPLATES"]

#: the templates this package holds
TEMPLATES = ("dequant4.cu", "gemv4.cu")


@lru_cache(maxsize=None)
def template_source(name: str) -> str:
    """The raw text of template ``name`` (e.g. ``dequant4.cu``)."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown template {name!r}; known: {', '.join(TEMPLATES)}")
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def template_hash(name: str) -> str:
    """SHA-256 of the template text: changes whenever the kernel source changes."""
    return hashlib.sha256(template_source(name).encode()).hexdigest()


def render(name: str, macros: dict) -> str:
    """The CUDA source of template ``name`` with ``macros`` (macro name -> integer) defined first."""
    lines = ["// rendered by nf4-tune kernel_templates.render"]
    for macro, value in macros.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"render: macro {macro}={value!r} is not an integer")
        lines.append(f"#define {macro} {value}")
    return "\n".join(lines) + "\n" + template_source(name)
