"""The dequantize family: bnb's ``dequantize_4bit`` in one fused launch, bit-exact.

Template ``kernel_templates/dequant.cu`` (after ``codes.cuh``); its header says what every knob changes. Everything
this family is lives here: knobs and constraints, defaults and presets, what a problem is
(shape, output dtype, quant type, blocksize), the launch plan (input checks and geometry),
input generation, the bit-exact gate against bnb's CUDA ``dequantize_4bit``, the peers it is
timed against, the ceiling beside it and the minimum-traffic model behind its GB/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..family import Constraint, DeviceLimits, Family, Knob
from ..vocabulary import BLOCKSIZES, DTYPES, OUT_BYTES, QUANTS, REF_COPY, TORCH_DTYPE, Problem, UnsupportedInput

__all__ = ["DEQUANT", "DequantFamily", "DequantPlan", "DequantInputs", "check_quant_state", "odd_shape",
           "mismatch_report", "REF_BNB", "REF_BNB_KERNEL", "MAX_ELEMENTS", "MAX_INFLIGHT_BYTES",
           "MAX_RESIDENT_THREADS"]

REF_BNB = "bnb dequantize_4bit"
REF_BNB_KERNEL = "bnb 4-bit kernel alone"

#: the kernel indexes elements with 32-bit unsigned integers and packed bytes as 2*i
MAX_ELEMENTS = 2**31 - 1
#: packed bytes in flight per thread (bytes_per_thread * unroll) above which the outputs held in
#: registers (up to 8 KiB per warp of fp32) only cost occupancy and spill
MAX_INFLIGHT_BYTES = 16
#: the most resident threads per SM of any supported arch (sm_80, sm_90, sm_100): a persistent
#: grid asking for more is a oneshot grid. On a device with fewer (sm_86, sm_89, sm_120: 1536)
#: the plan caps CTAs per SM to what is resident.
MAX_RESIDENT_THREADS = 2048


def _inflight(bytes_per_thread, unroll):
    if bytes_per_thread * unroll > MAX_INFLIGHT_BYTES:
        return (f"bytes_per_thread*unroll = {bytes_per_thread * unroll} packed bytes in flight per thread "
                f"exceeds {MAX_INFLIGHT_BYTES}")
    return None


def _grid_ctas(grid, ctas_per_sm):
    """oneshot grid: ctas_per_sm is None; persistent grid: ctas_per_sm in 1, 2, 4, 8"""
    if grid == "oneshot" and ctas_per_sm is not None:
        return "ctas_per_sm applies to the persistent grid only (use None with oneshot)"
    if grid == "persistent" and ctas_per_sm is None:
        return "the persistent grid needs ctas_per_sm (1, 2, 4 or 8)"
    return None


def _resident(threads, grid, ctas_per_sm):
    if grid == "persistent" and ctas_per_sm is not None and threads * ctas_per_sm > MAX_RESIDENT_THREADS:
        return (f"threads*ctas_per_sm = {threads * ctas_per_sm} exceeds the {MAX_RESIDENT_THREADS} resident "
                "threads of an SM")
    return None


# ----------------------------------------------------------------------------- the launch plan
class DequantPlan:
    """One problem's launch of one variant: the checks, the geometry and the kernel parameters.

    Built once per (config, element count, blocksize, group size) by the bench launch, the
    packed serving launch and the runtime; :meth:`check_call` checks the per-call tensors (bnb's
    error kinds; :class:`UnsupportedInput` for what this variant cannot take) and :meth:`args`
    lays out the kernel's parameters."""

    #: the kernel's parameters in order: A, absmax u8, code2, absmax2, absmax f32, offset, out,
    #: n, blocksize, log2 blocksize, group size, log2 group size, tiles
    PARAM_KINDS = ("ptr", "ptr", "ptr", "ptr", "ptr", "f32", "ptr", "u32", "u32", "u32", "u32", "u32", "u32")
    #: the parameters that change per call (pointers and the nested offset), in :meth:`args` order
    DYNAMIC = (0, 1, 2, 3, 4, 5, 6)

    def __init__(self, config, n: int, blocksize: int, groupsize: int, limits: DeviceLimits,
                 registers: Optional[int] = None, shape=None, dtype_name: Optional[str] = None):
        c = config
        if not 1 <= n <= MAX_ELEMENTS:
            raise UnsupportedInput(f"element count {n} is outside this kernel's range 1..{MAX_ELEMENTS}")
        if blocksize not in BLOCKSIZES:
            raise ValueError(f"invalid blocksize {blocksize}")
        if groupsize <= 0 or groupsize & (groupsize - 1):
            raise UnsupportedInput(f"state2.blocksize {groupsize} is not a power of two")
        if c.threads > limits.max_threads_per_block:
            raise UnsupportedInput(f"{c.short()}: {c.threads} threads exceed the device's "
                                   f"{limits.max_threads_per_block} per block")
        refusal = limits.registers_refusal(registers, c.threads) if registers is not None else None
        if refusal:
            raise UnsupportedInput(f"{c.short()}: {refusal}")
        self.config = c
        self.n = n
        self.blocksize = blocksize
        self.groupsize = groupsize
        self.shape = shape
        self.dtype = dtype_name or c.dtype
        nsteps = -(-((n + 1) // 2) // c.bytes_per_thread)
        self.ntiles = -(-nsteps // (c.threads * c.unroll))
        if c.grid == "oneshot":
            self.grid = self.ntiles
        else:
            resident = max(1, min(c.ctas_per_sm, limits.max_threads_per_sm // c.threads))
            self.grid = min(self.ntiles, limits.sm_count * resident)
        self.block = c.threads
        self.smem = 0
        self.nbytes_in = (n + 1) // 2
        self.nblocks = -(-n // blocksize)
        self.ngroups = -(-self.nblocks // groupsize)
        self.load_align = c.bytes_per_thread
        self.store_align = min(16, 2 * c.bytes_per_thread * OUT_BYTES[c.dtype])

    def constants(self) -> dict:
        """slot -> value of the parameters fixed by the plan."""
        bs, g = self.blocksize, self.groupsize
        return {7: self.n, 8: bs, 9: bs.bit_length() - 1, 10: g, 11: g.bit_length() - 1, 12: self.ntiles}

    def args(self, a: int, absmax_u8: int, code: int, absmax2: int, absmax_f32: int, offset: float,
             out: int) -> tuple:
        """Every kernel parameter, typed, for a cuda.core launch."""
        p, u = np.uint64, np.uint32
        k = self.constants()
        return (p(a), p(absmax_u8), p(code), p(absmax2), p(absmax_f32), np.float32(offset), p(out),
                u(k[7]), u(k[8]), u(k[9]), u(k[10]), u(k[11]), u(k[12]))

    def check_call(self, A, out, device_index: int) -> None:
        """The per-call checks of ``A`` and ``out`` (``out`` of this plan's shape and dtype):
        bnb's error kinds, and :class:`UnsupportedInput` for a misaligned or non-contiguous view."""
        self.check_out(out, A, device_index)
        self.check_packed(A)

    def check_out(self, out, A, device_index: int) -> None:
        """``out``'s checks (a tensor the caller gave; one the runtime allocated needs none)."""
        if out.shape != self.shape:
            raise ValueError(f"Expected out.shape == {list(self.shape)}, got {out.shape}")
        if out.get_device() != device_index:
            raise RuntimeError(f"Expected out.device == {A.device}, got {out.device}")
        if not out.is_contiguous():
            raise UnsupportedInput("out must be contiguous")
        if out.data_ptr() % self.store_align:
            raise UnsupportedInput(f"out's address is not {self.store_align}-byte aligned (this variant stores "
                                   f"{self.store_align} bytes at a time): {self.config.short()}")

    def check_packed(self, A) -> None:
        """The packed input's checks: its size and alignment (the runtime asks once per address)."""
        if A.nbytes < self.nbytes_in:
            raise ValueError(f"A holds {A.nbytes} bytes, {self.nbytes_in} needed for quant_state.shape "
                             f"{tuple(self.shape)}")
        if A.data_ptr() % self.load_align:
            raise UnsupportedInput(f"A's address is not {self.load_align}-byte aligned (this variant loads "
                                   f"{self.config.bytes_per_thread} bytes at a time): {self.config.short()}")


@dataclass
class QuantStateInfo:
    """A quant_state checked once (:func:`check_quant_state`)."""

    n: int
    shape: object
    dtype: str
    quant: str
    blocksize: int
    nested: bool
    groupsize: int


def check_attrs(qs) -> tuple:
    """bnb's checks of a quant_state's blocksize, quant type and dtype (its messages, ValueError);
    (blocksize, quant, dtype name)."""
    import torch

    if qs.blocksize not in BLOCKSIZES:
        raise ValueError(f"invalid blocksize {qs.blocksize}")
    if qs.quant_type not in QUANTS:
        raise ValueError(f"quant_type must be 'nf4' or 'fp4', got {qs.quant_type!r}")
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(qs.dtype)
    if dtype is None:
        raise ValueError(f"Blockwise 4bit dequantization only supports 16/32-bit floats, but got {qs.dtype}")
    return qs.blocksize, qs.quant_type, dtype


def check_quant_state(qs, device) -> QuantStateInfo:
    """Check ``qs`` as bnb does (its messages and kinds: ValueError for a bad blocksize, quant
    type, dtype or too few statistics; RuntimeError, as ``torch._check`` raises, for tensors on
    another device or of the wrong dtype) and as the kernel needs (:class:`UnsupportedInput`
    for non-contiguous statistics or a group size that is not a power of two)."""
    import torch

    bs, quant, dtype = check_attrs(qs)
    state2 = qs.state2
    stats = qs.absmax
    torch._check(stats.device == device, lambda: f"Expected absmax.device == {device}, got {stats.device}")
    if state2 is not None:
        groupsize = int(state2.blocksize)
        torch._check(stats.dtype == torch.uint8, lambda: f"nested absmax must be uint8, got {stats.dtype}")
        torch._check(state2.absmax.dtype == torch.float32 and state2.code.dtype == torch.float32,
                     lambda: "state2.absmax and state2.code must be float32")
        torch._check(state2.absmax.device == device and state2.code.device == device,
                     lambda: f"Expected state2 tensors on {device}")
        if groupsize <= 0 or groupsize & (groupsize - 1):
            raise UnsupportedInput(f"state2.blocksize {groupsize} is not a power of two")
        if not (stats.is_contiguous() and state2.absmax.is_contiguous() and state2.code.is_contiguous()):
            raise UnsupportedInput("quant_state tensors must be contiguous")
    else:
        groupsize = 256
        torch._check(stats.dtype == torch.float32, lambda: f"absmax must be float32, got {stats.dtype}")
        if not stats.is_contiguous():
            raise UnsupportedInput("quant_state.absmax must be contiguous")
    shape = qs.shape if type(qs.shape) is torch.Size else torch.Size(qs.shape)
    n = math.prod(shape)
    if n < 1:
        raise UnsupportedInput(f"quant_state.shape {tuple(shape)} holds no values")
    nblocks = -(-n // bs)
    if stats.numel() < nblocks:
        raise ValueError(f"absmax holds {stats.numel()} values, {nblocks} blocks needed")
    if state2 is not None and (state2.absmax.numel() < -(-nblocks // groupsize) or state2.code.numel() != 256):
        raise ValueError("state2 holds too few absmax values or a code that is not 256 values")
    return QuantStateInfo(n, shape, dtype, quant, bs, state2 is not None, groupsize)


def stat_pointers(qs) -> tuple:
    """(absmax u8, code2, absmax2, absmax f32, offset) kernel arguments of a checked quant_state;
    the nested offset is read back from the device (a synchronisation: do it once)."""
    s2 = qs.state2
    if s2 is not None:
        return qs.absmax.data_ptr(), s2.code.data_ptr(), s2.absmax.data_ptr(), 0, float(qs.offset)
    return 0, 0, 0, qs.absmax.data_ptr(), 0.0


# ----------------------------------------------------------------------------- the gate
def odd_shape(shape: Sequence[int]) -> tuple:
    """A small shape whose element count is odd and divisible by neither the blocksize nor the
    vector widths, so tails and the last partial byte are exercised."""
    rows = min(shape[0], 37) if len(shape) > 1 else 1
    cols = 4097 + 2 * (shape[-1] % 7)
    return (rows, cols) if len(shape) > 1 else (rows * cols,)


def _bits(t):
    import torch

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


@dataclass
class DequantInputs:
    """One draw of fresh random weights quantized by bnb on the GPU."""

    A: object
    qs: object
    shape: tuple
    offset: float


# ----------------------------------------------------------------------------- the family
class DequantFamily(Family):
    name = "dequant"
    headers = ("codes.cuh",)
    structures = {"dequant": ("dequant.cu",)}
    kernel_name = "nf4t_dequantize"
    title = "bnb dequantize_4bit in one fused launch, bit-exact"
    knobs = (
        Knob("bytes_per_thread", (1, 2, 4, 8, 16), default=4, refine=5, label="{}B",
             help="packed bytes one thread loads per step (one load of that width)"),
        Knob("unroll", (1, 2, 4, 8), refine=4, label="x{}",
             help="independent steps in flight per thread (all loads issued before first use)"),
        Knob("threads", (64, 128, 256, 512, 1024), "launch", default=256, refine=0, label="t{}",
             help="threads per block"),
        Knob("lut", ("branch", "global", "constant", "shared", "register"), default="shared", refine=6,
             help="where the 16-entry code lives: if-tree, global, __constant__, shared, or selects"),
        Knob("index", ("div", "shift", "hoisted"), default="shift", refine=7,
             help="scale lookup: integer division, shift, or one scale hoisted per step"),
        Knob("store", ("plain", "streaming"), refine=1, help="plain or streaming (evict-first) stores"),
        Knob("grid", ("oneshot", "persistent"), "launch", refine=2,
             help="oneshot: one tile per CTA; persistent: grid-stride loop over SMs x ctas_per_sm"),
        Knob("ctas_per_sm", (None, 1, 2, 4, 8), "launch", refine=3, label="x{}",
             help="persistent grid only: CTAs per SM (None for oneshot)"),
        Knob("dtype", DTYPES, "problem", default="bf16", help="output dtype"),
        Knob("quant", QUANTS, "problem", default="nf4", help="4-bit code: nf4 or fp4"),
    )
    constraints = (
        Constraint(("bytes_per_thread", "unroll"), _inflight,
                   help=f"bytes_per_thread x unroll <= {MAX_INFLIGHT_BYTES} packed bytes in flight per thread"),
        Constraint(("grid", "ctas_per_sm"), _grid_ctas),
        Constraint(("threads", "grid", "ctas_per_sm"), _resident,
                   help=f"persistent grid: threads x ctas_per_sm <= {MAX_RESIDENT_THREADS} resident threads per SM"),
    )
    presets = {
        # the blog post's final kernel: 4 packed bytes, 256 threads, shared table, shift indexing
        "blog": dict(bytes_per_thread=4, threads=256, unroll=1, lut="shared", index="shift",
                     store="plain", grid="oneshot", ctas_per_sm=None),
        # bitsandbytes' kDequantizeBlockwise<T, 512, 64, 8, NF4>: 8 bytes, 64 threads, global
        # table, integer division, one 512-byte tile per CTA
        "bnb-like": dict(bytes_per_thread=8, threads=64, unroll=1, lut="global", index="div",
                         store="plain", grid="oneshot", ctas_per_sm=None),
    }
    #: what the H200 searches found best across shapes, per output dtype
    builtin_defaults = {
        "bf16": dict(bytes_per_thread=4, unroll=4, threads=128, lut="shared", index="hoisted", store="streaming"),
        "fp16": dict(bytes_per_thread=4, unroll=4, threads=128, lut="shared", index="hoisted", store="streaming"),
        "fp32": dict(bytes_per_thread=2, unroll=4, threads=256, lut="shared", index="hoisted"),
    }
    peer_label = REF_BNB
    ceiling_label = REF_COPY
    problem_knobs = {"dtype": "dtype", "quant": "quant"}

    # -- problems ------------------------------------------------------------------------
    def check_problem(self, problem: Problem) -> None:
        if problem.family != self.name:
            raise ValueError(f"problem of family {problem.family!r} given to {self.name!r}")
        if problem.dtype not in DTYPES:
            raise ValueError(f"dtype {problem.dtype!r} is not one of {list(DTYPES)}")
        if problem.quant not in QUANTS:
            raise ValueError(f"quant {problem.quant!r} is not one of {list(QUANTS)}")
        if problem.blocksize not in BLOCKSIZES:
            raise ValueError(f"blocksize {problem.blocksize} is not one of {list(BLOCKSIZES)}")
        if problem.m is not None:
            raise ValueError("the dequant family has no batch (m)")
        if not 1 <= problem.numel <= MAX_ELEMENTS:
            raise ValueError(f"{problem.label()}: {problem.numel} values is outside 1..{MAX_ELEMENTS}")

    def builtin_default(self, problem: Problem):
        return self.config(**self.builtin_defaults[problem.dtype], **self.problem_values(problem))

    def traffic(self, problem: Problem, nested: bool = True, groupsize: int = 256) -> int:
        """The fewest bytes a dequantization must move: packed + absmax + group absmax + output."""
        n, bs = problem.numel, problem.blocksize
        nblocks = -(-n // bs)
        stats = nblocks * 1 + (-(-nblocks // groupsize)) * 4 + 256 * 4 + 4 if nested else nblocks * 4
        return (n + 1) // 2 + stats + n * OUT_BYTES[problem.dtype]

    # -- inputs and the gate ---------------------------------------------------------------
    def check_shapes(self, problem: Problem) -> list:
        return [tuple(problem.shape), odd_shape(problem.shape)]

    def make_inputs(self, problem: Problem, shape, seed: int, device: str = "cuda") -> DequantInputs:
        """Fresh normal weights of ``shape`` quantized by bnb on the GPU."""
        import torch
        import bitsandbytes.functional as F

        g = torch.Generator(device=device).manual_seed(seed)
        w = torch.randn(tuple(shape), generator=g, device=device, dtype=torch.float32)
        w = w.to(getattr(torch, TORCH_DTYPE[problem.dtype]))
        A, qs = F.quantize_4bit(w, blocksize=problem.blocksize, compress_statistics=True, quant_type=problem.quant)
        return DequantInputs(A, qs, tuple(shape), float(qs.offset))

    def expected(self, inputs: DequantInputs):
        import bitsandbytes.functional as F

        return F.dequantize_4bit(inputs.A, inputs.qs)

    def new_output(self, inputs: DequantInputs, poison: bool = True):
        import torch

        dtype = inputs.qs.dtype
        if poison:
            return torch.full(inputs.shape, float("nan"), device=inputs.A.device, dtype=dtype)
        return torch.empty(inputs.shape, device=inputs.A.device, dtype=dtype)

    def compare(self, got, want, inputs: DequantInputs, config=None) -> Optional[str]:
        """Bit for bit against bnb's CUDA output."""
        return mismatch_report(got, want)

    # -- launching -----------------------------------------------------------------------
    def plan_for(self, config, inputs: DequantInputs, limits: DeviceLimits, registers: Optional[int]) -> DequantPlan:
        info = check_quant_state(inputs.qs, inputs.A.device)
        if info.quant != config.quant:
            raise UnsupportedInput(f"quant_state.quant_type is {info.quant!r}, this variant decodes {config.quant!r}")
        if info.dtype != config.dtype:
            raise UnsupportedInput(f"quant_state.dtype is {inputs.qs.dtype}, this variant writes {config.dtype}")
        return DequantPlan(config, info.n, info.blocksize, info.groupsize, limits, registers, info.shape, info.dtype)

    def launch_args(self, plan: DequantPlan, inputs: DequantInputs, out) -> tuple:
        """Check the call's tensors against ``plan`` and lay out the kernel's parameters."""
        A, qs = inputs.A, inputs.qs
        for name, t in (("A", A), ("out", out)):
            if t.device.type != "cuda":
                raise UnsupportedInput(f"{name} must be on a CUDA device, got {t.device}")
            if not t.is_contiguous():
                raise UnsupportedInput(f"{name} must be contiguous")
        if out.dtype != qs.dtype:
            raise UnsupportedInput(f"out has dtype {out.dtype}, this variant writes {qs.dtype}")
        if out.numel() != plan.n:
            raise UnsupportedInput(f"out has {out.numel()} elements, quant_state.shape {tuple(qs.shape)} has {plan.n}")
        if A.device != out.device:
            raise UnsupportedInput(f"all tensors must be on one device, got {A.device} and {out.device}")
        plan.check_call(A, out.view(plan.shape), A.get_device())
        return plan.args(A.data_ptr(), *stat_pointers(qs)[:4], inputs.offset, out.data_ptr())

    # -- what it is judged against ---------------------------------------------------------
    def peers(self, inputs: DequantInputs, problem: Problem) -> dict:
        """label -> callable: bnb's full ``dequantize_4bit`` (what users call) and bnb's 4-bit
        kernel alone (the absmax decoded beforehand)."""
        import torch
        import bitsandbytes.functional as F

        A, qs = inputs.A, inputs.qs
        out = torch.empty(inputs.shape, dtype=qs.dtype, device=A.device)
        absmax_f = F.dequantize_blockwise(qs.absmax, qs.state2)
        absmax_f += qs.offset
        dtype = qs.dtype

        def bnb_full():
            F.dequantize_4bit(A, qs, out=out)

        def bnb_kernel():
            torch.ops.bitsandbytes.dequantize_4bit.out(A, absmax_f, problem.blocksize, problem.quant,
                                                        list(inputs.shape), dtype, out=out)

        bnb_full.output = out
        return {REF_BNB: bnb_full, REF_BNB_KERNEL: bnb_kernel}

    def verify_peers(self, peers: dict, inputs: DequantInputs, want) -> Optional[str]:
        """bnb's output after the timed runs must still be the reference (nothing raced)."""
        import torch

        peers[REF_BNB]()
        torch.cuda.synchronize()
        bad = mismatch_report(peers[REF_BNB].output, want)
        return f"bnb's own output changed between runs ({bad})" if bad else None

    def ceiling(self, inputs: DequantInputs, problem: Problem):
        """(label, callable, bytes moved): a device-to-device copy of the output size."""
        import torch

        out_bytes = problem.numel * OUT_BYTES[problem.dtype]
        src = torch.randint(0, 255, (out_bytes,), dtype=torch.uint8, device=inputs.A.device)
        dst = torch.empty_like(src)
        return REF_COPY, (lambda: dst.copy_(src)), 2 * out_bytes


DEQUANT = DequantFamily()
