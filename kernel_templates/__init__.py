"""The templated CUDA source of nf4-tune and the knobs that render its variants.

``dequant4.cu`` is one kernel family; its header says what each knob changes and why.
:func:`render` turns the source-level knobs of a config into a complete CUDA translation unit
(macro definitions followed by the template). Knobs that only change the launch (threads per
block, grid shape) are not part of the source.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources

__all__ = ["KERNEL_NAME", "SOURCE_KNOBS", "render", "template_hash", "template_source"]

KERNEL_NAME = "nf4t_dequantize"

#: knob name -> {value: macro value}; every source-level knob and the macro it sets.
SOURCE_KNOBS: dict[str, tuple[str, dict]] = {
    "bytes_per_thread": ("NF4T_BYTES", {1: 1, 2: 2, 4: 4, 8: 8, 16: 16}),
    "unroll": ("NF4T_UNROLL", {1: 1, 2: 2, 4: 4, 8: 8}),
    "lut": ("NF4T_LUT", {"branch": 0, "global": 1, "constant": 2, "shared": 3, "register": 4}),
    "index": ("NF4T_INDEX", {"div": 0, "shift": 1, "hoisted": 2}),
    "store": ("NF4T_STORE", {"plain": 0, "streaming": 1}),
    "dtype": ("NF4T_OUT", {"bf16": 0, "fp16": 1, "fp32": 2}),
    "quant": ("NF4T_QUANT", {"nf4": 0, "fp4": 1}),
}


@lru_cache(maxsize=1)
def template_source() -> str:
    """The raw template text (``dequant4.cu``)."""
    return resources.files(__name__).joinpath("dequant4.cu").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def template_hash() -> str:
    """SHA-256 of the template text: changes whenever the kernel source changes."""
    return hashlib.sha256(template_source().encode()).hexdigest()


def render(knobs: dict) -> str:
    """Render the CUDA source for the source-level ``knobs`` (a mapping with every key of
    :data:`SOURCE_KNOBS`; other keys are ignored)."""
    lines = ["// rendered by nf4-tune kernel_templates.render"]
    for knob, (macro, values) in SOURCE_KNOBS.items():
        if knob not in knobs:
            raise KeyError(f"render: missing knob {knob!r}")
        value = knobs[knob]
        if value not in values:
            raise ValueError(f"render: {knob}={value!r} is not one of {sorted(values, key=str)}")
        lines.append(f"#define {macro} {values[value]}")
    return "\n".join(lines) + "\n" + template_source()
