"""The correctness gate: a variant is checked against its family's reference before it is ever
timed.

Each check draws fresh random inputs (the family's :meth:`make_inputs`), poisons the output
with NaN, runs the variant through its launch plan and asks the family to compare the result
with the reference: bit for bit against bnb for the dequant family, an fp64 reference under a
derived error bound for the matmul family. A mismatch, a compile failure or a launch error
makes the config invalid, with the reason; nothing is raised for a bad variant.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..families import get as get_family
from ..kernel.launch import bind, load_kernel
from ..vocabulary import Problem

__all__ = ["GateResult", "check_config"]


@dataclass
class GateResult:
    ok: bool
    reason: str = ""
    checked: list = field(default_factory=list)   # shapes checked
    seed: Optional[int] = None


def check_config(config, problem: Problem, seed: Optional[int] = None, shapes: Optional[Sequence[tuple]] = None,
                 kernel=None) -> GateResult:
    """Run ``config`` on fresh random data of the problem's check shapes (its shape and an odd
    one, unless ``shapes`` is given) and compare with the family's reference. Never raises for
    a bad variant."""
    import torch

    family = get_family(problem.family) if config.family.name != problem.family else config.family
    seed = secrets.randbits(31) if seed is None else seed
    shapes = list(shapes) if shapes is not None else family.check_shapes(problem)
    result = GateResult(ok=True, seed=seed)
    try:
        k = kernel or load_kernel(config)
    except Exception as e:
        return GateResult(ok=False, reason=f"compile/load failed: {type(e).__name__}: {e}", seed=seed)
    for i, shape in enumerate(shapes):
        try:
            inputs = family.make_inputs(problem, shape, seed + i)
            want = family.expected(inputs)
            out = family.new_output(inputs)
            bind(k, inputs, out)()
            torch.cuda.synchronize()
        except Exception as e:
            return GateResult(ok=False, reason=f"shape {tuple(shape)}: {type(e).__name__}: {e}",
                              checked=result.checked, seed=seed)
        bad = family.compare(out, want, inputs, config)
        result.checked.append(tuple(shape))
        if bad:
            return GateResult(ok=False, reason=f"shape {tuple(shape)} (seed {seed + i}): {bad}", checked=result.checked,
                              seed=seed)
    return result
