"""The kernel families nf4-tune tunes, each one declaration (see nf4tune.family).

:func:`get` finds a family by the name stored with every measurement and problem.
"""

from __future__ import annotations

from ..family import Family
from .dequant import DEQUANT
from .matmul import MATMUL

__all__ = ["FAMILIES", "get", "DEQUANT", "MATMUL"]

#: name -> family, in the order --help lists them
FAMILIES: dict = {DEQUANT.name: DEQUANT, MATMUL.name: MATMUL}


def get(name: str) -> Family:
    """The family called ``name``; ValueError naming the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown kernel family {name!r}; known: {', '.join(FAMILIES)}") from None
