"""The matmul family's correctness gate.

bnb's own paths disagree with each other, so a variant is compared with an fp64 reference,
``A @ W.T + bias`` with ``W`` bnb's CUDA dequantization in float32 (the exact recipe, before any
rounding to a 16-bit dtype), under an error bound derived from the variant's arithmetic
(:func:`error_bound`), and its maximum and mean error must be no worse than bnb's ``matmul_4bit``
on the same data (beyond fp32 summation-order noise). Fresh random data every check, with
adversarial spreads (mixed signs, block absmax over 4 decades, activations over 2), NaN-poisoned
output, odd N, M not a multiple of the tile, bias and no bias, and a short K.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ...vocabulary import TORCH_DTYPE, Problem
from .space import rounded_codes

__all__ = ["MatmulGate", "MatmulInputs", "error_bound", "gamma"]


def gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def error_bound(config, K: int, S, y_abs):
    """The largest error the variant's arithmetic allows, per output element (a torch fp64
    tensor), against the fp64 reference with float32 weights.

    - fp32 accumulation over K products (a product, every partial sum, the lane, warp and split
      reductions, the scale's multiply): gamma(K + 16) * S, with S = |A| @ |W|.T + |bias|; the
      tensor cores accumulate with at least fp32's precision, allowed one extra bit;
    - the tensor-core paths round to the operand dtype first (mma: code * scale, as bnb's
      dequantize does; mma-ks, mma-rows and mma-cols: the code, multiplied by the fp32 scale after
      the mma), and so does SIMT with the 16-bit pair decodes (lut prmt / pairx: the code): u_op * S
      more (bf16 2^-8, fp16 2^-11);
    - mma-cols is that tensor-core case with rounded codes and no term of its own: the codes are
      rounded to the operand dtype in its pair table, the mma accumulates a window's products per
      (row, part) column in fp32, one FFMA a window applies the part's fp32 scale (bnb's recipe,
      __fmul_rn / __fadd_rn) to those sums, and the 8 / cols_mb parts of a row are added by at most
      three additions (one in the lane, two quad shuffles): a different order of the same K products
      with at most 8 roundings more, inside gamma(K + 16);
    - one rounding to the output dtype: u_out * (|y| + the above)."""
    u_out = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}[config.dtype]
    tensor = config.mma != "simt"
    acc = gamma(K + 16, 2.0**-23 if tensor else 2.0**-24) * S
    if rounded_codes(config):
        acc = acc + u_out * S          # operand dtype == activation dtype == output dtype
    return acc * (1 + u_out) + u_out * y_abs


@dataclass
class MatmulInputs:
    """One draw of fresh data: activations A (M x K), bnb's packed weight B and quant state, the
    bias (or None), and for the gate the fp64 reference and bnb's own result."""

    A: object
    B: object
    qs: object
    bias: object
    M: int
    N: int
    K: int
    ref: dict = field(default_factory=dict)


class MatmulGate:
    """The family's inputs and gate (a part of :class:`~nf4tune.families.matmul.MatmulFamily`)."""

    def check_shapes(self, problem: Problem) -> list:
        """(N, K, M, bias) of each check: the problem itself with a bias; an odd N with M not a
        multiple of the tile and no bias; a short K (three blocks) with a bias."""
        N, K = problem.shape
        m = problem.m or 1
        odd_m = m - 1 if m > 1 else 1
        odd_n = (min(N, 200) | 1) + 12
        return [(N, K, m, True), (odd_n, K, odd_m, False), (37, 3 * problem.blocksize, m, True)]

    def make_inputs(self, problem: Problem, shape, seed: int, device: str = "cuda") -> MatmulInputs:
        import torch
        import bitsandbytes.functional as F

        if len(shape) == 2:
            shape = (shape[0], shape[1], problem.m or 1, True)
        N, K, M, with_bias = shape
        dt = getattr(torch, TORCH_DTYPE[problem.dtype])
        g = torch.Generator(device=device).manual_seed(seed)
        nb = N * K // problem.blocksize
        spread = torch.pow(10.0, torch.rand(nb, generator=g, device=device) * 4 - 2)   # block absmax over 4 decades
        w = (torch.randn(nb, problem.blocksize, generator=g, device=device) * spread[:, None]).reshape(N, K)
        B, qs = F.quantize_4bit(w.to(dt), blocksize=problem.blocksize, compress_statistics=True,
                                quant_type=problem.quant)
        cols = torch.pow(10.0, torch.rand(K, generator=g, device=device) * 2 - 1)
        A = (torch.randn(M, K, generator=g, device=device) * cols).to(dt)
        bias = (torch.randn(N, generator=g, device=device) * 10.0).to(dt) if with_bias else None
        return MatmulInputs(A, B, qs, bias, M, N, K)

    def _reference(self, inputs: MatmulInputs) -> dict:
        """fp64 reference with float32 weights (bnb's CUDA dequantize, fp32 output), the bound's
        S = |A| @ |W|.T + |bias|, and bnb's own result and errors."""
        if inputs.ref:
            return inputs.ref
        import copy

        import torch
        import bitsandbytes as bnb
        import bitsandbytes.functional as F

        qs32 = copy.copy(inputs.qs)
        qs32.dtype = torch.float32
        W = F.dequantize_4bit(inputs.B, qs32).double()
        A = inputs.A.double()
        y = A @ W.t()
        S = A.abs() @ W.abs().t()
        if inputs.bias is not None:
            y = y + inputs.bias.double()
            S = S + inputs.bias.double().abs()
        with torch.no_grad():
            got = bnb.matmul_4bit(inputs.A, inputs.B.t(), inputs.qs, bias=inputs.bias)
        err = (got.double() - y).abs()
        inputs.ref = dict(y=y, S=S, bnb=got, bnb_max=float(err.max()), bnb_mean=float(err.mean()))
        del W
        return inputs.ref

    def expected(self, inputs: MatmulInputs):
        return self._reference(inputs)["y"]

    def new_output(self, inputs: MatmulInputs, poison: bool = True):
        import torch

        if poison:
            return torch.full((inputs.M, inputs.N), float("nan"), dtype=inputs.A.dtype, device=inputs.A.device)
        return torch.empty((inputs.M, inputs.N), dtype=inputs.A.dtype, device=inputs.A.device)

    def compare(self, got, want, inputs: MatmulInputs, config=None) -> Optional[str]:
        """Within the variant's derived bound everywhere, and max / mean error no worse than
        bnb's matmul_4bit beyond what two correct results may differ by: fp32 summation-order
        noise (gamma(K) * S) and one ulp of the output dtype (both are rounded to it)."""
        ref = self._reference(inputs)
        y, S = ref["y"], ref["S"]
        g = got.double()
        if not bool(g.isfinite().all()):
            bad = (~g.isfinite()).nonzero()[0].tolist()
            return f"non-finite output at {bad} (an element never written, or an overflow)"
        err = (g - y).abs()
        cfg = config or self.builtin_default(Problem((inputs.N, inputs.K), _dtype_name(inputs.A.dtype)))
        bound = error_bound(cfg, inputs.K, S, y.abs())
        over = err > bound
        if bool(over.any()):
            i = over.nonzero()[0].tolist()
            return (f"{int(over.sum())} of {err.numel()} outputs exceed the derived error bound; first at {i}: "
                    f"got {float(g[tuple(i)]):.6g}, fp64 reference {float(y[tuple(i)]):.6g}, error "
                    f"{float(err[tuple(i)]):.3g} > bound {float(bound[tuple(i)]):.3g}")
        # two results within fp32 summation-order noise of each other can still round to
        # neighbouring values of the output dtype: allow that noise and one output ulp
        u_out = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}[cfg.dtype]
        allowance = gamma(inputs.K + 16, 2.0**-24) * S + 2 * u_out * y.abs()
        if float(err.max()) > ref["bnb_max"] + float(allowance.max()):
            return f"max error {float(err.max()):.4g} is worse than bnb's {ref['bnb_max']:.4g}"
        if float(err.mean()) > ref["bnb_mean"] + float(allowance.mean()):
            return f"mean error {float(err.mean()):.4g} is worse than bnb's {ref['bnb_mean']:.4g}"
        return None


def _dtype_name(torch_dtype) -> str:
    return {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}[str(torch_dtype)]
