"""The correctness gate: a variant is compared bit for bit with bnb's CUDA ``dequantize_4bit``
before it is ever timed.

Each check draws fresh random weights, quantizes them with bnb on the GPU, fills ``out`` with
NaN, runs the variant and compares the raw bits with bnb's output. A mismatch or a launch
error makes the config invalid, with the reason (first mismatching index and both values).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .space import KernelConfig

__all__ = ["GateResult", "Problem", "check_config", "odd_shape", "mismatch_report", "TORCH_DTYPE"]

TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class Problem:
    """What a kernel is tuned for: a weight shape, output dtype, quant type and blocksize."""

    shape: tuple
    dtype: str = "bf16"
    quant: str = "nf4"
    blocksize: int = 64

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def label(self) -> str:
        return f"{'x'.join(map(str, self.shape))} {self.dtype} {self.quant} bs{self.blocksize}"

    @staticmethod
    def parse_shape(text: str) -> tuple:
        try:
            dims = tuple(int(d) for d in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"shape {text!r} is not ROWSxCOLS (e.g. 4096x4096)") from None
        if not dims or any(d <= 0 for d in dims) or len(dims) > 2:
            raise ValueError(f"shape {text!r} must be one or two positive sizes, e.g. 4096x4096")
        return dims


@dataclass
class GateResult:
    ok: bool
    reason: str = ""
    checked: list = field(default_factory=list)   # shapes checked
    seed: Optional[int] = None


def odd_shape(shape: Sequence[int]) -> tuple:
    """A small shape whose element count is odd and divisible by neither the blocksize nor the
    vector widths, so tails and the last partial byte are exercised."""
    rows = min(shape[0], 37) if len(shape) > 1 else 1
    cols = 4097 + 2 * (shape[-1] % 7)
    return (rows, cols) if len(shape) > 1 else (rows * cols,)


def _bits(t):
    torch = __import__("torch")
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def mismatch_report(got, want) -> Optional[str]:
    """None when ``got`` and ``want`` hold identical bits; else the first mismatching index and
    both values (and how many differ)."""
    gb, wb = _bits(got.reshape(-1)), _bits(want.reshape(-1))
    diff = (gb != wb).nonzero()
    if diff.numel() == 0:
        return None
    i = int(diff[0, 0])
    return (f"{diff.numel()} of {gb.numel()} elements differ from bnb; first at flat index {i}: "
            f"got {float(got.reshape(-1)[i])!r} (bits {int(gb[i]) & 0xFFFFFFFF:#x}), "
            f"bnb {float(want.reshape(-1)[i])!r} (bits {int(wb[i]) & 0xFFFFFFFF:#x})")


def quantized_random(problem: Problem, shape, seed: int, device="cuda"):
    """Fresh normal weights of ``shape`` quantized by bnb on the GPU: (A, quant_state)."""
    import torch
    import bitsandbytes.functional as F

    g = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
    w = w.to(getattr(torch, TORCH_DTYPE[problem.dtype]))
    return F.quantize_4bit(w, blocksize=problem.blocksize, compress_statistics=True, quant_type=problem.quant)


def check_config(config: KernelConfig, problem: Problem, seed: Optional[int] = None,
                 shapes: Optional[Sequence[tuple]] = None, kernel=None) -> GateResult:
    """Run ``config`` on fresh random data of the problem's shape and an odd shape and compare
    with bnb bit for bit (``out`` NaN-poisoned first). Never raises for a bad variant."""
    import torch
    import bitsandbytes.functional as F
    from .launch import load_kernel

    seed = secrets.randbits(31) if seed is None else seed
    shapes = list(shapes) if shapes is not None else [tuple(problem.shape), odd_shape(problem.shape)]
    result = GateResult(ok=True, seed=seed)
    try:
        k = kernel or load_kernel(config)
    except Exception as e:
        return GateResult(ok=False, reason=f"compile/load failed: {type(e).__name__}: {e}", seed=seed)
    for i, shape in enumerate(shapes):
        try:
            A, qs = quantized_random(problem, shape, seed + i)
            want = F.dequantize_4bit(A, qs)
            out = torch.full(shape, float("nan"), device=A.device, dtype=want.dtype)
            k(A, qs, out)
            torch.cuda.synchronize()
        except Exception as e:
            return GateResult(ok=False, reason=f"shape {shape}: {type(e).__name__}: {e}", checked=result.checked,
                              seed=seed)
        bad = mismatch_report(out, want)
        result.checked.append(tuple(shape))
        if bad:
            return GateResult(ok=False, reason=f"shape {shape} (seed {seed + i}): {bad}", checked=result.checked,
                              seed=seed)
    return result
