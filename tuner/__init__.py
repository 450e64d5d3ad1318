"""nf4-tune: fused 4-bit (NF4/FP4) kernels for bitsandbytes' format, tuned per GPU.

The public API::

    from nf4tune import patch_bitsandbytes          # bnb's own calls served by the tuned kernels
    from nf4tune import dequantize_4bit, matmul_4bit # drop-ins with bnb's arguments and results
    from nf4tune import explain, explain_matmul     # which kernel serves a call, and why
    from nf4tune import autotune                    # opt-in: tune a model's untuned shapes on this GPU

``NF4TUNE_AUTOTUNE=1`` autotunes each untuned matmul shape on its first call instead
(:mod:`nf4tune.tune.autotune`); ``NF4TUNE_CONFIGS`` names the serving table (default: the packaged one).

Layers, each a folder, imports pointing one way (tests/test_layers.py checks it):
``vocabulary`` and ``family`` (the words and the family machinery) < ``families`` (one
declaration per kernel family) < ``db`` (the store) < ``kernel`` (compile, load, launch) <
``measure`` (gate, timing, bench) < ``serve`` (the runtime and the bnb patch) < ``tune`` (search,
autotune) and ``bench`` (what users run, measured) < ``track`` (the nightly job) < ``reports`` < ``cli``.
"""

import os as _os

from ._version import __version__
from .families import DEQUANT, FAMILIES, MATMUL, get as get_family
from .family import Config, Constraint, Family, Knob
from .serve import (dequantize_4bit, explain, explain_matmul, matmul_4bit, patch_bitsandbytes, stats,
                    use_configs)
from .tune.autotune import autotune
from .vocabulary import BLOCKSIZES, DTYPES, QUANTS, InvalidConfig, Problem, UnsupportedInput

__all__ = [
    "__version__", "patch_bitsandbytes", "dequantize_4bit", "matmul_4bit", "explain", "explain_matmul", "autotune",
    "stats", "use_configs", "Problem", "Family", "Config", "Knob", "Constraint", "FAMILIES", "DEQUANT", "MATMUL",
    "get_family", "BLOCKSIZES", "DTYPES", "QUANTS", "InvalidConfig", "UnsupportedInput",
]

if _os.environ.get("NF4TUNE_AUTOTUNE") == "1":
    from .tune.autotune import enable_first_use as _enable

    _enable()
