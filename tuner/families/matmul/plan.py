"""The matmul family's launch plan: bnb's input checks, a variant's geometry (grid, block, K slices,
stream-K's runs), its dynamic shared memory, the split-K workspace, and the kernel's parameters."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...family import DeviceLimits
from ...vocabulary import BLOCKSIZES, OUT_BYTES, QUANTS, UnsupportedInput
from .resources import (bulk_chunk, bulk_ring_bytes, cols_smem, cols_stage_bytes, cols_window, ring_bytes, rows_span,
                        rows_stage_bytes, scale_table_bytes, stream_k_parts)
from .space import DYN_TABLE_BYTES, DYN_TABLE_LUTS

__all__ = ["MatmulPlan", "MatmulLaunch", "check_matmul_inputs", "stat_args", "MAX_WEIGHT"]

#: the kernel indexes W with 32-bit integers
MAX_WEIGHT = 2**31 - 1


def check_matmul_inputs(A, qs, bias=None):
    """bnb's checks of a grad-free ``matmul_4bit`` call (its kinds: ValueError / RuntimeError),
    and :class:`UnsupportedInput` for what the fused kernel cannot take (K not a multiple of
    the blocksize, which bnb refuses to fuse too; non-CUDA or non-contiguous data)."""
    import torch

    if qs is None:
        raise ValueError("quant_state is required")
    if len(qs.shape) != 2:
        raise ValueError("matmul_4bit: quant_state.shape must be 2D [N, K]")
    N, K = int(qs.shape[0]), int(qs.shape[1])
    if A.shape[-1] != K:
        raise RuntimeError(f"A inner dim ({A.shape[-1]}) does not match weight ({K})")
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(A.dtype)
    if dtype is None:
        raise RuntimeError(f"unsupported dtype {A.dtype}")
    if bias is not None:
        if bias.ndim != 1:
            raise RuntimeError(f"bias must be 1D, got {bias.ndim}D")
        if bias.dtype != A.dtype:
            raise RuntimeError(f"bias dtype ({bias.dtype}) must match A dtype ({A.dtype})")
        if bias.numel() != N:
            raise RuntimeError(f"bias has {bias.numel()} values, the weight {N} rows")
    if qs.blocksize not in BLOCKSIZES:
        raise ValueError(f"invalid blocksize {qs.blocksize}")
    if qs.quant_type not in QUANTS:
        raise ValueError(f"quant_type must be 'nf4' or 'fp4', got {qs.quant_type!r}")
    if K % qs.blocksize:
        raise UnsupportedInput(f"inner dimension ({K}) is not a multiple of blocksize {qs.blocksize}: "
                               "not fused (bnb's own path runs)")
    if N * K > MAX_WEIGHT:
        raise UnsupportedInput(f"a {N}x{K} weight exceeds the kernel's 32-bit index range")
    if qs.state2 is not None and int(qs.state2.blocksize) & (int(qs.state2.blocksize) - 1):
        raise UnsupportedInput(f"state2.blocksize {qs.state2.blocksize} is not a power of two")
    return N, K, dtype


class MatmulPlan:
    """One launch of one variant for M x K activations against an N x K weight: the geometry,
    the split-K workspace, the checks and the kernel parameters."""

    #: A, B, absmax u8, code2, absmax2, absmax f32, offset*, bias, out, workspace, counters,
    #: M, N, K, log2 blocksize, log2 group size, K per split
    PARAM_KINDS = ("ptr",) * 11 + ("u32",) * 6
    DYNAMIC = (0, 1, 2, 3, 4, 5, 6, 7, 8)

    def __init__(self, config, M: int, N: int, K: int, blocksize: int, groupsize: int, limits: DeviceLimits,
                 registers: Optional[int] = None, device=None):
        c = config
        if M < 1 or N < 1 or K < 1:
            raise UnsupportedInput(f"empty matmul ({M}x{K} @ {N}x{K})")
        if K % blocksize or K % 32:
            raise UnsupportedInput(f"inner dimension ({K}) is not a multiple of blocksize {blocksize}: not fused")
        if N * K > MAX_WEIGHT:
            raise UnsupportedInput(f"a {N}x{K} weight exceeds the kernel's 32-bit index range")
        threads = 32 * (c.warps + (c.feed == "bulk"))      # the bulk feed's producer warp
        if threads > limits.max_threads_per_block:
            raise UnsupportedInput(f"{c.short()}: {threads} threads exceed the device's {limits.max_threads_per_block}")
        refusal = limits.registers_refusal(registers, threads) if registers is not None else None
        if refusal:
            raise UnsupportedInput(f"{c.short()}: {refusal}")
        self.config = c
        self.ring = c.stages > 0 and c.stats != "tile"     # statistics copied in aligned 4-byte words (check_stats)
        self.pair_absmax = c.mma == "mma-cols" and c.cols_mb == 1   # two absmax bytes in one 16-bit load
        self.M, self.N, self.K = M, N, K
        self.blocksize, self.groupsize = blocksize, groupsize
        if c.mma == "mma-rows" and c.span != rows_span(c.load_bytes, blocksize):
            need = rows_span(c.load_bytes, blocksize)
            raise UnsupportedInput(f"{c.short()}: a window of {8 * c.load_bytes} values spans {need} block(s) of "
                                   f"{blocksize}, the variant is built for span {c.span} (the row-tile tensor-core "
                                   f"path scales each of a window's span parts once; span {need} serves this "
                                   "blocksize)")
        if c.mma == "mma-cols" and blocksize != c.part:
            serves = f"part {blocksize} serves it" if blocksize in c.family.knob("part").values else "no part serves it"
            raise UnsupportedInput(f"{c.short()}: blocksize {blocksize} is not the variant's part {c.part} (mma-cols "
                                   f"scales each part of a window once, so a part must be one block; {serves})")
        if c.mma == "mma-ks":
            kit = 8 * c.load_bytes                              # K per window (a quad of lanes)
            if c.feed == "bulk":
                kit = bulk_chunk(c.load_bytes, c.warps, c.unroll)   # split-K slices of whole chunks
            rows_per_cta = c.rows_per_warp
        else:
            kit = {"mma": 128, "mma-rows": 8 * c.load_bytes * c.unroll,
                   "mma-cols": cols_window(c.part, c.cols_mb)}.get(c.mma, 64 * c.load_bytes)  # K per step
            rows_per_cta = c.warps * c.rows_per_warp
        stream_k = c.mma == "mma-rows" and c.persist
        kper = -(-(-(-K // (1 if stream_k else c.ksplit))) // kit) * kit
        self.kper = kper
        self.splits = -(-K // kper)
        tiles = -(-N // rows_per_cta)
        batch_per_cta = c.mtile // c.span           # mma-rows with span > 1: each batch row takes span columns
        mtiles = -(-M // batch_per_cta)
        act_bytes = OUT_BYTES[c.dtype]
        # a 64 KiB pair table (DYN_TABLE_LUTS) comes first in the dynamic shared memory, on every path that takes it
        lut_table = DYN_TABLE_BYTES if c.lut in DYN_TABLE_LUTS else 0
        # each path: its dynamic shared memory (self.smem, and what it holds), its static tables, the limit (the
        # opt-in, but for SIMT without a 64 KiB table) and where the K slice shows in the refusal
        limit, at = limits.smem_per_block_optin, f" at K per split {kper}"
        if c.mma == "mma-ks":
            # the warps' partial sums, then the ring
            if c.feed == "bulk":
                ring = bulk_ring_bytes(c.load_bytes, c.rows_per_warp, c.unroll, c.stages, c.warps, min(c.mtile, M))
                kc = bulk_chunk(c.load_bytes, c.warps, c.unroll)
                if groupsize * 32 < kc:
                    raise UnsupportedInput(f"{c.short()}: a chunk of {kc} values may span more than two groups of "
                                           f"{groupsize} blocks (the bulk feed copies two group absmax per row)")
            else:
                ring = ring_bytes(c.load_bytes, c.rows_per_warp, c.unroll, c.stages, c.warps, c.stats)
            table = scale_table_bytes(c.rows_per_warp, kper, blocksize) if c.stats == "tile" else 0
            # (the lut table,) the partial sums, the ring, the tile's scale table
            sums = c.warps * c.mtile * c.rows_per_warp * 4
            self.smem = lut_table + sums + ring + table
            static = 64 + 1024 + 16 * c.stages + (256 * 32 * 4 if c.lut == "pair" else 0)
            held = f"lut table {lut_table}, partial sums {sums}, ring {ring}, scale table {table}"
            at = ""
        elif c.mma == "mma-rows":
            # (the lut table,) A's stage: the batch rows this launch has (at most the tile's)
            staged = rows_stage_bytes(kper, min(batch_per_cta, M), act_bytes)
            self.smem = lut_table + staged
            static = 64 + 1024 + (256 * 32 * 4 if c.lut == "pair" else 0)      # 16-entry lut, code2, pair table
            held = f"A staged: {staged}, lut table: {lut_table}"
        elif c.mma == "mma-cols":
            # the pair table (at a 64 KiB boundary with table64) and A's stage: the batch rows this launch has
            staged = cols_stage_bytes(kper, c.part, c.cols_mb, min(c.mtile, M))
            self.smem = cols_smem(staged, c.table64)
            static = 64 + 1024
            held = f"A staged: {staged}, the pair table{' at a 64 KiB boundary' if c.table64 else ''}"
        else:
            # (the lut table, which then needs the opt-in,) A staged in shared memory
            staged = c.mtile * kper * act_bytes if c.astage == "shared" else 0
            self.smem = lut_table + staged
            static = 64 + 1024 + (256 * 16 * 8 if c.lut == "pair" else 0)     # 16-entry lut, code2, pair table
            limit = limits.smem_per_block_optin if lut_table else limits.smem_per_block
            held = f"A staged: {staged}, lut table: {lut_table}"
        if self.smem + static > limit:
            raise UnsupportedInput(f"{c.short()}: {self.smem} bytes of dynamic shared memory ({held}) beside {static} "
                                   f"of static tables exceed the device's {limit} per block{at}")
        gx = tiles
        #: mma-rows with persist (stream-K): how many CTAs each row tile is cut between (None: not stream-K)
        self.stream_k_parts = None
        if getattr(c, "persist", 0):
            # as many CTAs as can be resident at once (A's stage of the whole K: the stage only shrinks below)
            resident = limits.max_threads_per_sm // threads
            if registers:
                resident = min(resident, limits.regs_per_sm // (registers * threads))
            resident = min(resident, max(1, (limits.smem_per_block_optin + 1024) // (self.smem + static + 1024)))
            if stream_k:
                # stream-K: each CTA of a batch tile's share of the resident CTAs (times ksplit: CTAs per
                # resident slot) takes an even run of the (row tile, group) units; A's stage holds its longest slice
                groups = -(-K // kit)
                units = tiles * groups
                gx = min(units, max(1, max(1, resident) * limits.sm_count * c.ksplit // mtiles))
                self.kper = min(groups, -(-units // gx)) * kit
                self.smem = lut_table + rows_stage_bytes(self.kper, min(batch_per_cta, M), act_bytes)
                self.stream_k_parts = stream_k_parts(tiles, groups, gx)
            else:
                # mma-ks: a few CTAs per SM loop over the row tiles
                gx = min(tiles, max(1, resident) * limits.sm_count)
        self.grid = (gx, self.splits, mtiles)
        self.block = threads
        #: the most CTAs whose partial sums one output takes (fp32 atomics into the workspace): up to 2 the sum is
        #: the same whatever the order they arrive in; from 3 on its rounding may differ from run to run
        self.parts = max(self.splits, *(self.stream_k_parts or [1]))
        self.ws = self.counters = None
        if self.parts > 1:
            import torch

            self.ws = torch.zeros(M * N, dtype=torch.float32, device=device or "cuda")
            self.counters = torch.zeros(tiles * mtiles, dtype=torch.int32, device=device or "cuda")

    @property
    def order_free(self) -> bool:
        """Whether every output's sum is the same bits whatever order its parts arrive in (at most two)."""
        return self.parts <= 2

    def constants(self) -> dict:
        return {9: self.ws.data_ptr() if self.ws is not None else 0,
                10: self.counters.data_ptr() if self.counters is not None else 0,
                11: self.M, 12: self.N, 13: self.K, 14: self.blocksize.bit_length() - 1,
                15: self.groupsize.bit_length() - 1, 16: self.kper}

    def args(self, a, b, absmax_u8, code, absmax2, absmax_f32, offset_ptr, bias, out) -> tuple:
        p, u = np.uint64, np.uint32
        k = self.constants()
        return (p(a), p(b), p(absmax_u8), p(code), p(absmax2), p(absmax_f32), p(offset_ptr), p(bias), p(out),
                p(k[9]), p(k[10]), u(k[11]), u(k[12]), u(k[13]), u(k[14]), u(k[15]), u(k[16]))

    def check_call(self, A, B, out) -> None:
        """Per-call checks of the tensors (sizes, contiguity, alignment)."""
        if not A.is_contiguous():
            raise UnsupportedInput("A must be contiguous")
        if A.numel() != self.M * self.K:
            raise UnsupportedInput(f"A holds {A.numel()} values, the plan {self.M}x{self.K}")
        if B.nbytes < self.N * self.K // 2:
            raise ValueError(f"B holds {B.nbytes} bytes, {self.N * self.K // 2} needed for a {self.N}x{self.K} weight")
        if out.numel() != self.M * self.N or not out.is_contiguous():
            raise UnsupportedInput(f"out must be a contiguous tensor of {self.M}x{self.N} values")
        if A.data_ptr() % 16 or B.data_ptr() % 16:
            raise UnsupportedInput("A and B must be 16-byte aligned for the fused kernel")

    def check_stats(self, stats: tuple) -> None:
        """The ring copies the statistics in aligned 4-byte words: their pointers must be 4-byte aligned;
        mma-cols at cols_mb 1 loads two absmax bytes at once: the absmax bytes must be 2-byte aligned."""
        if self.ring and any(p % 4 for p in stats[:4]):
            raise UnsupportedInput("the statistics (absmax, nested code and absmax) must be 4-byte aligned for "
                                   "the shared-memory ring")
        if self.pair_absmax and stats[0] % 2:
            raise UnsupportedInput("the absmax bytes must be 2-byte aligned for mma-cols (one 16-bit load gives "
                                   "two blocks' bytes)")


def stat_args(qs) -> tuple:
    """(absmax u8, code2, absmax2, absmax f32, offset*) kernel arguments: the nested offset is
    passed as a device pointer (no read-back, so a call never synchronises)."""
    s2 = qs.state2
    if s2 is not None:
        return qs.absmax.data_ptr(), s2.code.data_ptr(), s2.absmax.data_ptr(), 0, qs.offset.data_ptr()
    return 0, 0, 0, qs.absmax.data_ptr(), 0


class MatmulLaunch:
    """The family's launch (a part of :class:`~nf4tune.families.matmul.MatmulFamily`): a variant's plan
    for one call's inputs, and the kernel's arguments."""

    def plan_for(self, config, inputs, limits: DeviceLimits, registers: Optional[int]) -> MatmulPlan:
        N, K, dtype = check_matmul_inputs(inputs.A, inputs.qs, inputs.bias)
        if dtype != config.dtype:
            raise UnsupportedInput(f"A is {dtype}, this variant computes in {config.dtype}")
        if inputs.qs.quant_type != config.quant:
            raise UnsupportedInput(f"quant_state.quant_type is {inputs.qs.quant_type!r}, this variant decodes "
                                   f"{config.quant!r}")
        M = inputs.A.numel() // K
        g = int(inputs.qs.state2.blocksize) if inputs.qs.state2 is not None else 256
        return MatmulPlan(config, M, N, K, int(inputs.qs.blocksize), g, limits, registers, inputs.A.device)

    def launch_args(self, plan: MatmulPlan, inputs, out) -> tuple:
        for name, t in (("A", inputs.A), ("B", inputs.B), ("out", out)):
            if t.device.type != "cuda":
                raise UnsupportedInput(f"{name} must be on a CUDA device, got {t.device}")
        if out.dtype != inputs.A.dtype:
            raise UnsupportedInput(f"out has dtype {out.dtype}, this variant writes {inputs.A.dtype}")
        plan.check_call(inputs.A, inputs.B, out)
        stats = stat_args(inputs.qs)
        plan.check_stats(stats)
        bias = inputs.bias.data_ptr() if inputs.bias is not None else 0
        return plan.args(inputs.A.data_ptr(), inputs.B.data_ptr(), *stats, bias, out.data_ptr())
