"""nf4-tune: fused 4-bit (NF4/FP4) kernels for bitsandbytes' format, tuned per GPU.

Layers, each a folder, imports pointing one way (tests/test_layers.py checks it):
``vocabulary`` and ``family`` (the words and the family machinery) < ``families`` (one
declaration per kernel family) < ``db`` (the store) < ``kernel`` (compile, load, launch) <
``measure`` (gate, timing, bench) < ``serve`` (the runtime and the bnb patch) < ``tune``
(search) < ``track`` (the nightly job) < ``reports`` < ``cli``.
"""

from ._version import __version__
from .family import Config, Family, Knob, Constraint
from .families import DEQUANT, FAMILIES, get as get_family
from .vocabulary import BLOCKSIZES, DTYPES, QUANTS, InvalidConfig, Problem, UnsupportedInput


__all__ = [
    "__version__", "Problem", "Family", "Config", "Knob", "Constraint", "FAMILIES", "DEQUANT", "get_family",
    "BLOCKSIZES", "DTYPES", "QUANTS", "InvalidConfig", "UnsupportedInput",
]
