"""The matmul family: ``y = A @ dequant(W).T (+ bias)`` straight from bnb's packed weight, for
decode (M = 1..64 rows of A). Template ``kernel_templates/gemv4.cu``; its header says what every
knob changes.

A problem is the weight's shape N x K (bnb's ``[out_features, in_features]``), the activation
dtype, the quant type, the blocksize and the batch bucket ``m`` (1, 2, 4, ..., 64: a call with
M rows is served by the bucket >= M).

The gate: bnb's own paths disagree with each other, so a variant is compared with an fp64
reference, ``A @ W.T + bias`` with ``W`` bnb's CUDA dequantization in float32 (the exact
recipe, before any rounding to a 16-bit dtype), under an error bound derived from the variant's
arithmetic (:func:`error_bound`), and its maximum and mean error must be no worse than bnb's
``matmul_4bit`` on the same data (beyond fp32 summation-order noise). Fresh random data every
check, with adversarial spreads (mixed signs, block absmax over 4 decades, activations over 2),
NaN-poisoned output, odd N, M not a multiple of the tile, bias and no bias, and a short K.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..family import Constraint, DeviceLimits, Family, Knob
from ..vocabulary import (BLOCKSIZES, DTYPES, M_BUCKETS, OUT_BYTES, QUANTS, REF_READ, TORCH_DTYPE, Problem,
                          UnsupportedInput)

__all__ = ["MATMUL", "MatmulFamily", "MatmulPlan", "MatmulInputs", "REF_BNB_MATMUL", "REF_DENSE", "error_bound",
           "check_matmul_inputs"]

REF_BNB_MATMUL = "bnb matmul_4bit"
REF_DENSE = "dense F.linear (16-bit weight)"
#: the kernel indexes W with 32-bit integers
MAX_WEIGHT = 2**31 - 1
#: the read-only reduction the ceiling is measured on
READ_BYTES = 512 << 20
#: the LUTs that decode to 16-bit operand pairs (codes rounded to the activation dtype)
PAIR16_LUTS = ("prmt", "pairx", "pairmix")
#: the LUTs whose table lies in dynamic shared memory: 256 entries x 256-byte rows (the template's
#: NF4T_DYN_TABLE), 64 KiB, which needs the shared-memory opt-in
DYN_TABLE_LUTS = ("pairx", "pairf", "pairmix")
DYN_TABLE_BYTES = 256 * 256
#: the LUTs that decode to float pairs for the CUDA cores' FMAs: the SIMT path only
FLOAT_PAIR_LUTS = ("pairf", "pairmix")
#: the LUTs of the row-tile tensor-core path (mma-rows): the 16-bit pair tables, and the byte-permute
#: decode (the codes in registers: about twice the loop's instructions, no shared-memory lookups)
ROWS_LUTS = ("pair", "pairx", "prmt")
#: the row-tile tensor-core path's registers of loads in flight, at most
ROWS_MAX_LOAD_REGISTERS = 48
#: mma-rows with prefetch 2 (two groups ahead, 16-byte loads): three groups of W in registers; 64 admits
#: the span loop's 16-row groups of 2 windows (60). NVRTC 13 (sm_90): 127 registers at batch tile 8 (16 warps
#: fit), 162 with the 16-row batch tile (12 warps at most: a larger CTA is refused at plan time)
ROWS_MAX_LOAD_REGISTERS_TWO_AHEAD = 64
#: mma-rows' register caps (the regcap knob; 0: none). Each is the largest count that fits one more warp a
#: register sub-partition (16,384 registers, 256 a warp): 80 fits 6, 72 fits 7 (104-128 fit 4, 96 fits 5,
#: which no CTA size of the warps knob turns into more warps an SM than 16)
REGCAPS = (0, 80, 72)


#: the tensor-core paths with W's rows as the mma's M: (name in messages, what rows_per_warp counts,
#: what one scale multiply covers)
_ROW_OPERAND_PATHS = {
    "mma-ks": ("K-split", "rows per CTA", "window and block"),
    "mma-rows": ("row-tile", "rows per warp", "window (a window lies in one block)"),
}


def _path_shape(mma, load_bytes, rows_per_warp, mtile, scale, dtype):
    if mma == "mma":
        if load_bytes != 16:
            return "the tensor-core path loads 16 bytes per lane"
        if rows_per_warp not in (16, 32, 64):
            return "the tensor-core path takes 16, 32 or 64 rows per warp (m16 tiles)"
        if mtile not in (8, 16):
            return "the tensor-core path tiles the batch by 8 or 16 (n8 tiles)"
        if scale != "value":
            return "the tensor-core path scales every value (the weight is rounded as bnb's dequantize rounds it)"
        if dtype == "fp32":
            return "no tensor-core path for fp32 activations"
        return None
    if mma in _ROW_OPERAND_PATHS:
        path, rows, scaled = _ROW_OPERAND_PATHS[mma]
        if rows_per_warp not in (16, 32):
            return f"the {path} tensor-core path takes 16 or 32 {rows} (m16 tiles)"
        tiles = (8, 16, 32) if mma == "mma-rows" else (8, 16)
        if mtile not in tiles:
            return f"the {path} tensor-core path tiles the batch by {', '.join(map(str, tiles))} (n8 tiles)"
        if scale != "block":
            return f"the {path} tensor-core path scales once per {scaled}"
        if dtype == "fp32":
            return "no tensor-core path for fp32 activations"
        return None
    if rows_per_warp > 32:
        return "the SIMT path takes at most 32 rows per warp"
    if mtile > 8:
        return "the SIMT path tiles the batch by at most 8"
    if mtile * 2 * load_bytes > 64:
        return f"mtile*values per lane = {mtile * 2 * load_bytes} fp32 registers of A exceed 64"
    if rows_per_warp * load_bytes > 128:
        return f"rows_per_warp*load_bytes = {rows_per_warp * load_bytes} bytes of W in flight per lane exceed 128"
    if mtile * rows_per_warp > 32:
        return f"mtile*rows_per_warp = {mtile * rows_per_warp} accumulators exceed 32"
    return None


def ks_registers(load_bytes, rows_per_warp, mtile, unroll, prefetch, stages=0, feed="lanes", stats="lanes") -> int:
    """32-bit registers the K-split path holds for its loads in flight: per window, W (two rows of
    each m16 tile), the raw statistics (with the tile's scale table: one block column instead),
    and the batch rows' run of A; twice that when the next group is prefetched. With the per-warp
    shared-memory ring (``stages`` > 0) W and the statistics are in shared memory: the registers
    hold A for two groups. With the bulk feed everything is in
    shared memory: the registers hold one group (W, the statistics and A) read back."""
    words = max(1, load_bytes // 4)
    rt, nt = rows_per_warp // 16, mtile // 8
    if stages and feed == "bulk":
        return unroll * (rt * 2 * words + rt * 4 + nt * load_bytes)
    if stages:
        return 2 * unroll * nt * load_bytes
    per_window = rt * 2 * words + (1 if stats == "tile" else rt * 4) + nt * load_bytes
    return (1 + prefetch) * unroll * per_window


def rows_registers(load_bytes, rows_per_warp, unroll, prefetch, span=1) -> int:
    """32-bit registers the row-tile tensor-core path (mma-rows) holds for its loads in flight: per
    group, W of ``unroll`` windows (rows g and g+8 of each m16 tile) and the raw statistics of a lane's
    share of the group's ``unroll`` x ``span`` blocks per row (a quad loads them: one block per lane and
    row while there are at most 4); twice that with the prefetch, three times two groups ahead (prefetch 2).
    A is read from its shared-memory stage window by window."""
    words = max(1, load_bytes // 4)
    rt = rows_per_warp // 16
    slots = -(-unroll * span // 4)
    return (1 + prefetch) * (unroll * rt * 2 * words + slots * rt * 2 * 2)


def rows_span(load_bytes, blocksize) -> int:
    """The blocks a window of the row-tile tensor-core path spans (its ``span`` knob must match): a
    window is 8 x ``load_bytes`` values."""
    return max(1, 8 * load_bytes // blocksize)


def rows_stage_bytes(kper, arows, act_bytes=2) -> int:
    """The row-tile tensor-core path's stage of A: ``arows`` batch rows of the K slice in the operand
    order, a row's 2 x kper bytes rounded up to 128 plus 64 (gemv4.cu's tc_a_pitch: a quarter warp's
    two quads then hit all 32 banks)."""
    return arows * (-(-kper * act_bytes // 128) * 128 + 64)


def scale_table_bytes(rows_per_warp, kper, blocksize) -> int:
    """Shared memory of the tile's scale table (``stats`` tile): a float per block column of the K
    slice (a slice not on a block boundary touches one more) and row of the tile, rows padded by one."""
    return (-(-kper // blocksize) + 1) * (rows_per_warp + 1) * 4


def ring_bytes(load_bytes, rows_per_warp, unroll, stages, warps, stats="lanes") -> int:
    """Shared memory of the K-split path's ring: ``stages`` groups per warp, each W (``load_bytes``
    per lane and row pair) and its statistics (8 bytes per lane and row pair; none with the tile's
    scale table)."""
    return warps * stages * unroll * (rows_per_warp // 16) * 2 * 32 * (load_bytes + (0 if stats == "tile" else 8))


def bulk_chunk(load_bytes, warps, unroll) -> int:
    """K per chunk of the bulk feed: warps x unroll windows of 8 x load_bytes values."""
    return warps * unroll * 8 * load_bytes


def bulk_row_bytes(load_bytes, warps, unroll) -> int:
    """The bulk feed's stride between a chunk's W rows in shared memory: a row's KC/2 bytes rounded
    up to 128, plus 4 x load_bytes so that the rows of one load phase fall in distinct banks."""
    return -(-bulk_chunk(load_bytes, warps, unroll) // 2 // 128) * 128 + 4 * load_bytes


def bulk_stage_bytes(load_bytes, rows_per_warp, unroll, warps, arows, act_bytes=2) -> tuple:
    """(stage bytes, zero row bytes) of the bulk feed (gemv4.cu's bulk_geometry): W rows, then
    ``arows`` batch rows of A (2 x KC rounded up to 128, plus 16), then each W row's statistics
    (the aligned words of its absmax bytes and two group absmax, or a float per block of 32 values
    at least)."""
    kc = bulk_chunk(load_bytes, warps, unroll)
    arowb = -(-kc * act_bytes // 128) * 128 + 16
    nested, plain = 4 * ((kc // 32 + 3) // 4 + 1) + 8, kc // 8
    sb = -(-max(nested, plain) // 16) * 16
    stage = rows_per_warp * (bulk_row_bytes(load_bytes, warps, unroll) + sb) + arows * arowb
    return stage, kc * act_bytes


def bulk_ring_bytes(load_bytes, rows_per_warp, unroll, stages, warps, arows) -> int:
    """Shared memory of the bulk feed's ring: ``stages`` chunks, and one zero row of A."""
    stage, zero = bulk_stage_bytes(load_bytes, rows_per_warp, unroll, warps, arows)
    return stages * stage + zero


def _ks_shape(mma, load_bytes, rows_per_warp, mtile, warps, astage, unroll, persist, prefetch, stages, feed, stats,
              span):
    if span != 1 and mma != "mma-rows":
        return "span (a window over several blocks) is a knob of the row-tile tensor-core path (mma-rows)"
    if mma == "mma-rows":
        if stages or feed != "lanes" or stats != "lanes":
            return "stages, feed and stats are knobs of the K-split tensor-core path (mma-ks)"
        if astage != "shared":
            return "the row-tile tensor-core path stages A in shared memory (astage shared)"
        if 8 * load_bytes < 32 * span:
            return (f"span {span}: a window of {8 * load_bytes} values in {span} parts of fewer than 32 values "
                    "(the smallest blocksize) never needs it")
        regs = rows_registers(load_bytes, rows_per_warp, unroll, prefetch, span)
        limit = ROWS_MAX_LOAD_REGISTERS_TWO_AHEAD if prefetch == 2 else ROWS_MAX_LOAD_REGISTERS
        if regs > limit:
            return f"{regs} registers of loads in flight exceed {limit} (mma-rows{', prefetch 2' if prefetch == 2 else ''})"
        return None
    if mma != "mma-ks":
        if unroll != 1 or persist or stages or feed != "lanes" or stats != "lanes":
            return ("unroll, persist, stages, feed and stats are knobs of the K-split tensor-core path (unroll and "
                    "persist also of mma-rows)")
        return None
    if stats == "tile" and feed == "bulk":
        return "the tile's scale table (stats tile) is not a structure of the bulk feed (it copies the statistics)"
    if feed == "bulk" and not stages:
        return "the bulk feed fills a shared-memory ring: it needs stages"
    if feed == "lanes" and stages == 2:
        return "the per-warp ring takes 4 stages (2 lost everywhere on the H200)"
    if astage != "global":
        return "the K-split tensor-core path reads its run of A per window (no shared staging)"
    if warps * rows_per_warp * mtile > 2048:
        return f"warps*rows*mtile = {warps * rows_per_warp * mtile} partial sums exceed the 8 KiB reduction buffer"
    if stages and prefetch:
        return "the shared-memory ring (stages) replaces the register prefetch"
    if stages and unroll > 2:
        return "the shared-memory ring takes groups of 1 or 2 windows (its depth is the stages)"
    regs = ks_registers(load_bytes, rows_per_warp, mtile, unroll, prefetch, stages, feed, stats)
    if regs > 128:
        return f"{regs} registers of loads in flight exceed 128"
    if feed == "bulk":
        ring = bulk_ring_bytes(load_bytes, rows_per_warp, unroll, stages, warps, mtile)
    else:
        ring = ring_bytes(load_bytes, rows_per_warp, unroll, stages, warps, stats)
    if ring > 160 * 1024:
        return f"a ring of {ring} bytes exceeds 160 KiB of shared memory per CTA"
    return None


def _lut_path(mma, lut, dtype):
    if mma == "mma-rows" and lut not in ROWS_LUTS:
        return f"the row-tile tensor-core path decodes to 16-bit code pairs ({', '.join(ROWS_LUTS)})"
    if lut in PAIR16_LUTS and (mma == "mma" or dtype == "fp32"):
        return (f"lut {lut} decodes to 16-bit operand pairs: the K-split tensor-core path and SIMT, with bf16 or "
                "fp16 activations")
    if lut in FLOAT_PAIR_LUTS and mma != "simt":
        return f"lut {lut} decodes to float pairs for the FMAs: the SIMT path only"
    return None


def _prmt_mix(mma, lut, load_bytes, prmt_quarters):
    if prmt_quarters and (mma != "mma-rows" or lut != "pairx"):
        return "prmt_quarters mixes lut prmt into lut pairx's decode on the row-tile tensor-core path (mma-rows) only"
    if prmt_quarters and load_bytes < 8:
        return "prmt_quarters splits a load's byte pairs in quarters: 8- or 16-byte loads (a 4-byte load has two)"
    return None


def rounded_codes(config) -> bool:
    """The variant multiplies the codes rounded to the 16-bit activation dtype (the tensor-core paths,
    and SIMT with the 16-bit pair decodes lut prmt / pairx / pairmix, whose odd rows take them), not the exact
    float32 codes."""
    return config.mma != "simt" or config.lut in PAIR16_LUTS


def _warps_path(mma, warps):
    if warps > 8 and mma not in ("simt", "mma-rows"):
        return f"{warps} warps per CTA: the SIMT and row-tile tensor-core paths only"
    return None


def _prefetch_path(mma, load_bytes, prefetch):
    if mma == "mma" and prefetch:
        return "prefetch is a SIMT knob (the tensor-core path keeps its loads for the next window in flight by row tiles)"
    if prefetch == 2 and mma != "mma-rows":
        return "prefetch 2 (two groups ahead) is a knob of the row-tile tensor-core path (mma-rows)"
    if prefetch == 2 and load_bytes != 16:
        return "prefetch 2 (two groups ahead) is for the 16-byte loads of the span loop"
    return None


def _stream_k_shape(mma, persist, rows_per_warp, mtile):
    # (ksplit is not tied in here: a launch knob in this group would multiply the group's combinations, the
    # space's walk, by its 5 values; with stream-K it counts the CTAs per resident slot instead, MatmulPlan)
    if mma != "mma-rows" or not persist:
        return None
    if rows_per_warp != 16 or mtile != 8:
        # gemv4.cu: the slice is a function call under a 512-thread launch bound (128 registers)
        return ("mma-rows with persist (stream-K) takes one 16-row tile per warp and the 8-row batch tile: "
                "larger tiles spill in the loop under its 128-register bound")
    return None


def stream_k_runs(units: int, ctas: int) -> list:
    """Stream-K's even shares (mma-rows with persist): CTA c takes units [c*units//ctas, (c+1)*units//ctas),
    as the kernel computes them."""
    if not 0 < ctas <= units:
        raise ValueError(f"stream-K needs 1..{units} CTAs for {units} units, not {ctas}")
    return [(c * units // ctas, (c + 1) * units // ctas) for c in range(ctas)]


def stream_k_cta(u: int, units: int, ctas: int) -> int:
    """The CTA whose stream-K run holds unit ``u`` (the template's stream_k_cta)."""
    return ((u + 1) * ctas - 1) // units


def stream_k_parts(tiles: int, groups: int, ctas: int) -> list:
    """For each row tile of ``groups`` units: how many CTAs' runs it is cut into (the kernel's count of the
    CTAs that add a slice of it to the workspace; 1: one CTA writes it whole)."""
    units = tiles * groups
    return [stream_k_cta((r + 1) * groups - 1, units, ctas) - stream_k_cta(r * groups, units, ctas) + 1
            for r in range(tiles)]


def _achunk_path(mma, achunk):
    if achunk and mma != "mma-rows":
        return "achunk (A read a chunk at a time) is a knob of the row-tile tensor-core path (mma-rows) only"
    return None


def _regcap_path(mma, persist, regcap):
    if regcap and (mma != "mma-rows" or persist):
        # stream-K's kernel is bound to 512 threads by __launch_bounds__, which __maxnreg__ cannot join
        return "regcap (a register cap) is a knob of the row-tile tensor-core path without stream-K (mma-rows, persist 0)"
    return None


def _tile_fits_batch(mma, mtile, m, span):
    if mma == "simt" and mtile > m:
        return f"mtile {mtile} exceeds the batch bucket {m}"
    if span > 1 and mma == "mma-rows" and mtile >= 8:
        # a window over span blocks: mtile / span batch rows per CTA (other paths refuse span, _ks_shape)
        # (session 17 allowed W read twice, by two batch tiles, and measured it on the H200 at M = 8: slower than
        # the 16-row tile, 28.5 against 26.8 us at 4096x14336 and 33.0 against 25.2 at 8192x8192; refused again)
        if mtile // span < m:
            return (f"span {span} leaves {mtile // span} batch rows of mtile {mtile} per CTA, fewer than the batch "
                    f"bucket {m}: W would be read {-(-m // (mtile // span))} times")
        if mtile >= 16 and m <= mtile // span // 2:
            return f"a {mtile}-row batch tile wastes half the tensor core at batch {m} (span {span})"
        return None
    if mma != "simt" and mtile >= 16 and m <= mtile // 2:
        return f"a {mtile}-row batch tile wastes half the tensor core at batch {m}"
    return None


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


# ----------------------------------------------------------------------------- the launch plan
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
        self.M, self.N, self.K = M, N, K
        self.blocksize, self.groupsize = blocksize, groupsize
        if c.mma == "mma-rows" and c.span != rows_span(c.load_bytes, blocksize):
            need = rows_span(c.load_bytes, blocksize)
            raise UnsupportedInput(f"{c.short()}: a window of {8 * c.load_bytes} values spans {need} block(s) of "
                                   f"{blocksize}, the variant is built for span {c.span} (the row-tile tensor-core "
                                   f"path scales each of a window's span parts once; span {need} serves this "
                                   "blocksize)")
        if c.mma == "mma-ks":
            kit = 8 * c.load_bytes                              # K per window (a quad of lanes)
            if c.feed == "bulk":
                kit = bulk_chunk(c.load_bytes, c.warps, c.unroll)   # split-K slices of whole chunks
            rows_per_cta = c.rows_per_warp
        else:
            kit = {"mma": 128, "mma-rows": 8 * c.load_bytes * c.unroll}.get(c.mma, 64 * c.load_bytes)  # K per step
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
            if self.smem + static > limits.smem_per_block_optin:
                raise UnsupportedInput(f"{c.short()}: {self.smem} bytes of dynamic shared memory (lut table "
                                       f"{lut_table}, partial sums {sums}, ring {ring}, scale table {table}) beside "
                                       f"{static} of static tables exceed the device's "
                                       f"{limits.smem_per_block_optin} per block")
        elif c.mma == "mma-rows":
            # (the lut table,) A's stage: the batch rows this launch has (at most the tile's)
            staged = rows_stage_bytes(kper, min(batch_per_cta, M), act_bytes)
            self.smem = lut_table + staged
            static = 64 + 1024 + (256 * 32 * 4 if c.lut == "pair" else 0)      # 16-entry lut, code2, pair table
            if self.smem + static > limits.smem_per_block_optin:
                raise UnsupportedInput(f"{c.short()}: {self.smem} bytes of dynamic shared memory (A staged: "
                                       f"{staged}, lut table: {lut_table}) beside {static} of static tables "
                                       f"exceed the device's {limits.smem_per_block_optin} per block at K per "
                                       f"split {kper}")
        else:
            # (the lut table, which then needs the opt-in,) A staged in shared memory
            staged = c.mtile * kper * act_bytes if c.astage == "shared" else 0
            self.smem = lut_table + staged
            static = 64 + 1024 + (256 * 16 * 8 if c.lut == "pair" else 0)     # 16-entry lut, code2, pair table
            limit = limits.smem_per_block_optin if lut_table else limits.smem_per_block
            if self.smem + static > limit:
                raise UnsupportedInput(f"{c.short()}: {self.smem} bytes of dynamic shared memory (A staged: "
                                       f"{staged}, lut table: {lut_table}) beside {static} of static tables "
                                       f"exceed the device's {limit} per block at K per split {kper}")
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
        """The ring copies the statistics in aligned 4-byte words: their pointers must be 4-byte aligned."""
        if self.ring and any(p % 4 for p in stats[:4]):
            raise UnsupportedInput("the statistics (absmax, nested code and absmax) must be 4-byte aligned for "
                                   "the shared-memory ring")


def stat_args(qs) -> tuple:
    """(absmax u8, code2, absmax2, absmax f32, offset*) kernel arguments: the nested offset is
    passed as a device pointer (no read-back, so a call never synchronises)."""
    s2 = qs.state2
    if s2 is not None:
        return qs.absmax.data_ptr(), s2.code.data_ptr(), s2.absmax.data_ptr(), 0, qs.offset.data_ptr()
    return 0, 0, 0, qs.absmax.data_ptr(), 0


# ----------------------------------------------------------------------------- the gate
def gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def error_bound(config, K: int, S, y_abs):
    """The largest error the variant's arithmetic allows, per output element (a torch fp64
    tensor), against the fp64 reference with float32 weights.

    - fp32 accumulation over K products (a product, every partial sum, the lane, warp and split
      reductions, the scale's multiply): gamma(K + 16) * S, with S = |A| @ |W|.T + |bias|; the
      tensor cores accumulate with at least fp32's precision, allowed one extra bit;
    - the tensor-core paths round to the operand dtype first (mma: code * scale, as bnb's
      dequantize does; mma-ks: the code, multiplied by the fp32 scale after the mma), and so does
      SIMT with the 16-bit pair decodes (lut prmt / pairx: the code): u_op * S more (bf16 2^-8,
      fp16 2^-11);
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


class MatmulFamily(Family):
    name = "matmul"
    template = "gemv4.cu"
    kernel_name = "nf4t_matmul"
    title = "bnb's grad-free matmul_4bit (decode, M = 1..64) fused from the packed weight"
    knobs = (
        Knob("mma", ("simt", "mma", "mma-ks", "mma-rows"), "source", "NF4T_MMA",
             help="simt: fp32 FMAs on CUDA cores; mma: tensor cores (mma.sync m16n8k16, batch padded to 8/16), "
                  "a warp per row tile; mma-ks: tensor cores with W rows as the mma's M, the CTA's warps "
                  "splitting K, 16-bit code pairs and one scale multiply per block; mma-rows: mma-ks's "
                  "operands and decode, each warp owning its row tiles over the CTA's K slice, A staged in "
                  "shared memory once per CTA, a window's statistics loaded once per row"),
        Knob("load_bytes", (4, 8, 16), "source", "NF4T_LOAD", label="{}B",
             help="bytes of W one lane loads per row per step (8, 16 or 32 values)"),
        Knob("rows_per_warp", (1, 2, 4, 8, 16, 32, 64), "source", "NF4T_RPW", label="r{}",
             help="rows of W per warp (SIMT: loads in flight; MMA: m16 tiles), all reusing one load of A"),
        Knob("mtile", (1, 2, 4, 8, 16, 32), "source", "NF4T_MTILE", label="m{}", help="rows of A per CTA"),
        Knob("warps", (1, 2, 4, 8, 12, 14, 16), "launch", label="w{}",
             help="warps per CTA (12, 14, 16: SIMT and mma-rows only, one pair table and one stage of A for more warps; 12 and 14 "
                  "change how many rows a wave of resident CTAs covers, and so the last wave's fill)"),
        Knob("ksplit", (1, 2, 4, 8, 16), "launch", label="k/{}",
             help="split-K: slices of K over CTAs, summed by fp32 atomics, the last CTA finishing the tile; "
                  "mma-rows with persist (stream-K): CTAs per resident slot (its runs are that much shorter)"),
        Knob("lut", ("shared", "register", "pair", "prmt", "pairx", "pairf", "pairmix"), "source", "NF4T_LUT",
             help="the 16-entry code in shared memory, a select tree in registers, a 256-entry table of "
                  "code pairs (one lookup per byte), replicated per lane phase (32 KiB), or (bf16/fp16, mma-ks "
                  "and SIMT) the codes as 16-bit byte tables in registers, four nibbles per byte permute (no "
                  "memory), or the 16-bit pair table with 256-byte rows (64 KiB): a lookup's offset is one byte "
                  "permute; pairf (SIMT): the float pair table with 256-byte rows (64 KiB), a permute and an "
                  "8-byte load per packed byte, the exact codes; pairmix (SIMT, bf16/fp16): both in one 64 KiB "
                  "table, even rows through the float pairs, odd rows through the 16-bit pairs"),
        Knob("astage", ("global", "shared"), "source", "NF4T_ASTAGE", label="A:{}",
             help="A read per step from global memory (L1/L2), or staged once per CTA in shared memory"),
        Knob("scale", ("value", "block"), "source", "NF4T_SCALE", label="s:{}",
             help="scale every weight, or the sum of a lane's run once (SIMT)"),
        Knob("wload", ("plain", "stream"), "source", "NF4T_WLOAD",
             help="plain loads of W, or streaming (ld.global.nc.L1::no_allocate)"),
        Knob("prefetch", (0, 1, 2), "source", "NF4T_PREFETCH", label="pf{}",
             help="SIMT, mma-ks and mma-rows: load the next step's W and statistics before computing the current one; "
                  "2 (mma-rows, 16-byte loads): two groups ahead"),
        Knob("unroll", (1, 2, 4), "source", "NF4T_UNROLL", label="u{}",
             help="mma-ks, mma-rows: windows of K whose loads are all issued before the first is used"),
        Knob("span", (1, 2, 4), "source", "NF4T_SPAN", label="sp{}", hidden=(1,),
             help="mma-rows: blocks a window (8 x load_bytes values) spans; 2 and 4 give each block's part of "
                  "the window its own columns of the mma's n8 (8 / span batch rows per n8 tile), so 16-byte "
                  "loads work at blocksize 64 with one mma per window; must equal 8 x load_bytes / blocksize "
                  "(at least 1) of the problem"),
        Knob("prmt_quarters", (0, 1, 2), "source", "NF4T_PRMTQ", label="pq{}", hidden=(0,),
             help="mma-rows with lut pairx: quarters of the packed bytes decoded by lut prmt's byte permutes "
                  "(ALU only) instead of the pair table's shared loads, which share the L1 pipe with W's loads"),
        Knob("persist", (0, 1), "source", "NF4T_PERSIST", label="p{}",
             help="mma-ks: a few CTAs per SM loop over the row tiles (tables filled once per CTA); mma-rows: "
                  "stream-K: as many CTAs as are resident at once (times ksplit), each an equal run of the (row "
                  "tile, group of K) units, a tile cut between CTAs summed in the split-K workspace"),
        Knob("stages", (0, 2, 4), "source", "NF4T_STAGES", label="st{}",
             help="mma-ks: 0 loads W into registers; N stages W through a shared-memory ring N deep (feed: "
                  "per warp by the lanes' cp.async, 4 only; or per CTA by a producer warp's bulk copies)"),
        Knob("feed", ("lanes", "bulk"), "source", "NF4T_FEED",
             help="mma-ks with stages: lanes: each lane copies its own bytes into its warp's ring; bulk: a "
                  "producer warp copies each chunk (W and A rows by cp.async.bulk, sm_90+, and the statistics) "
                  "into a ring the CTA's warps share, mbarrier-guarded: the other warps only read shared memory"),
        Knob("stats", ("lanes", "tile"), "source", "NF4T_STATS", label="stats:{}",
             help="mma-ks, register feed or per-warp ring: lanes: every lane loads (or copies) and decodes its "
                  "rows' statistics with each window; tile: the CTA decodes the row tile's scales for its K slice "
                  "into shared memory first (each block once), a lane's scale is then one shared-memory load"),
        Knob("regcap", REGCAPS, "source", "NF4T_MAXNREG", label="rc{}", hidden=(0,),
             help="mma-rows without stream-K: 0 no cap; N: at most N registers a thread (__maxnreg__), so that "
                  "more warps fit an SM (80: 6 warps a register sub-partition, 72: 7, against 4 at 104-128); "
                  "spills go to local memory"),
        Knob("achunk", (0, 1), "source", "NF4T_ACHUNK", label="ac{}", hidden=(0,),
             help="mma-rows: 0 a window's runs of A read from shared memory at once (load_bytes registers a "
                  "batch tile of 8 rows); 1 one 16-byte chunk at a time, just before its two k-steps (4 registers "
                  "a batch tile): fewer registers, so more warps an SM, the same sums bit for bit"),
        Knob("dtype", DTYPES, "problem", "NF4T_ACT", help="activation (and output) dtype"),
        Knob("quant", QUANTS, "problem", "NF4T_QUANT", help="4-bit code: nf4 or fp4"),
        Knob("m", M_BUCKETS, "problem", label="", help="the batch bucket the config is tuned for (not in the source)"),
    )
    constraints = (
        Constraint(("mma", "load_bytes", "rows_per_warp", "mtile", "scale", "dtype"), _path_shape),
        Constraint(("mma", "mtile", "m", "span"), _tile_fits_batch),
        Constraint(("mma", "load_bytes", "prefetch"), _prefetch_path),
        Constraint(("mma", "persist", "rows_per_warp", "mtile"), _stream_k_shape),
        Constraint(("mma", "warps"), _warps_path),
        Constraint(("mma", "persist", "regcap"), _regcap_path),
        Constraint(("mma", "achunk"), _achunk_path),
        Constraint(("mma", "lut", "dtype"), _lut_path),
        Constraint(("mma", "lut", "load_bytes", "prmt_quarters"), _prmt_mix),
        Constraint(("mma", "load_bytes", "rows_per_warp", "mtile", "warps", "astage", "unroll", "persist",
                    "prefetch", "stages", "feed", "stats", "span"), _ks_shape),
    )
    constraint_text = (
        "mma: load_bytes 16, rows_per_warp 16/32/64, mtile 8/16, scale value, dtype bf16/fp16",
        "simt: rows_per_warp <= 32, mtile <= 8, mtile*2*load_bytes <= 64 registers of A, "
        "rows_per_warp*load_bytes <= 128 bytes in flight, mtile*rows_per_warp <= 32 accumulators",
        "simt: mtile <= the batch bucket m; mma, mma-ks, mma-rows: no tile of 16 or more rows that the batch "
        "fills at most half of (mma-rows with span: mtile / span batch rows per CTA, at least m)",
        "warps 12, 14, 16: simt and mma-rows only",
        "mma-ks: rows_per_warp 16/32 (rows per CTA), mtile 8/16, scale block, A global, dtype bf16/fp16, "
        "warps*rows*mtile <= 2048, loads in flight <= 128 registers, the ring (stages) <= 160 KiB and without "
        "prefetch; the bulk feed with stages; stats tile not with the bulk feed; unroll, persist, stages, feed, "
        "stats only here",
        "lut prmt/pairx: mma-ks, mma-rows or simt, bf16/fp16 (16-bit code pairs; simt's pairx table needs the "
        "shared-memory opt-in)",
        "lut pairf: simt only (float pairs; its table needs the shared-memory opt-in)",
        "lut pairmix: simt only, bf16/fp16 (float and 16-bit pairs; its table needs the shared-memory opt-in)",
        "mma-rows: rows_per_warp 16/32 (rows per warp), mtile 8/16/32, scale block, A shared, lut pair/pairx/prmt, "
        f"dtype bf16/fp16, loads in flight <= {ROWS_MAX_LOAD_REGISTERS} registers; warps up to 16; unroll, "
        "persist (stream-K: rows_per_warp 16, mtile 8; ksplit: CTAs per resident slot), no stages/feed/stats; "
        "span 2/4 only here, "
        "with parts of at least 32 values (8 x load_bytes >= 32 x span); plan time: span == max(1, 8 x "
        "load_bytes / blocksize), A's stage fits the opt-in",
        "prmt_quarters 1/2: mma-rows with lut pairx and 8- or 16-byte loads only",
        "regcap 80/72: mma-rows without stream-K (persist 0) only",
        "achunk 1: mma-rows only",
        f"prefetch 2: mma-rows with 16-byte loads only, loads in flight <= {ROWS_MAX_LOAD_REGISTERS_TWO_AHEAD} registers",
        "plan time: A staged in shared memory fits 48 KiB; K a multiple of the blocksize",
    )
    defaults = dict(mma="simt", load_bytes=16, rows_per_warp=4, mtile=1, warps=4, ksplit=1, lut="shared",
                    astage="global", scale="block", wload="stream", prefetch=0, unroll=1, span=1, prmt_quarters=0, persist=0, stages=0,
                    feed="lanes", stats="lanes", regcap=0, achunk=0,
                    dtype="bf16",
                    quant="nf4", m=1)
    presets = {
        # bnb's gemm_4bit_simt: one warp per row, 4 warps per CTA, 32 values per lane per step
        "bnb-like": dict(mma="simt", load_bytes=16, rows_per_warp=1, mtile=1, warps=4, ksplit=1, lut="shared",
                         astage="global", scale="value", wload="plain", prefetch=0),
    }
    refine_order = ("ksplit", "warps", "rows_per_warp", "prefetch", "wload", "scale", "load_bytes", "mtile", "mma",
                    "lut", "astage", "unroll", "span", "prmt_quarters", "persist", "stages",
                    "feed", "stats", "regcap", "achunk")
    peer_label = REF_BNB_MATMUL
    ceiling_label = REF_READ
    problem_knobs = {"dtype": "dtype", "quant": "quant", "m": "m"}

    # -- problems ------------------------------------------------------------------------
    def check_problem(self, problem: Problem) -> None:
        if problem.family != self.name:
            raise ValueError(f"problem of family {problem.family!r} given to {self.name!r}")
        if len(problem.shape) != 2:
            raise ValueError(f"{problem.label()}: the matmul family's shape is N x K (out x in features)")
        if problem.dtype not in DTYPES or problem.quant not in QUANTS:
            raise ValueError(f"{problem.label()}: dtype {problem.dtype!r} / quant {problem.quant!r} unknown")
        if problem.blocksize not in BLOCKSIZES:
            raise ValueError(f"blocksize {problem.blocksize} is not one of {list(BLOCKSIZES)}")
        if problem.m not in M_BUCKETS:
            raise ValueError(f"{problem.label()}: m must be one of {list(M_BUCKETS)}")
        N, K = problem.shape
        if K % problem.blocksize:
            raise ValueError(f"{problem.label()}: K={K} is not a multiple of the blocksize; bnb does not fuse "
                             "such a matmul and neither does nf4-tune (bnb's own path serves it)")
        if N * K > MAX_WEIGHT:
            raise ValueError(f"{problem.label()}: the weight exceeds 2**31-1 values")

    def builtin_default(self, problem: Problem):
        m = problem.m or 1
        pv = self.problem_values(problem)
        # bf16 / fp16: tensor cores with K over the warps, the H200 exploration's winners at
        # 8192x8192 (examples/h200/matmul/explore-ks.txt): batch tile 8 up to m = 8, 16 above
        if problem.dtype != "fp32":
            ks = dict(mma="mma-ks", load_bytes=8, rows_per_warp=32, lut="pair", scale="block", wload="stream",
                      unroll=2, ksplit=1, **pv)
            if m <= 8:
                return self.config(mtile=8, warps=8, **ks)
            return self.config(mtile=16, warps=4, prefetch=1, persist=1, **ks)
        if m >= 8:
            return self.config(load_bytes=4, rows_per_warp=4, mtile=8, warps=4, ksplit=2, **pv)
        if m == 4:
            return self.config(load_bytes=8, rows_per_warp=4, mtile=4, warps=4, ksplit=2, **pv)
        return self.config(load_bytes=16, rows_per_warp=4, mtile=min(m, 2), warps=4, ksplit=2, **pv)

    def traffic(self, problem: Problem, nested: bool = True, groupsize: int = 256) -> int:
        """The fewest bytes the matmul moves: packed W, its statistics, A and y."""
        N, K = problem.shape
        M = problem.m or 1
        nblocks = N * K // problem.blocksize
        stats = nblocks + (-(-nblocks // groupsize)) * 4 + 256 * 4 + 4 if nested else nblocks * 4
        eb = OUT_BYTES[problem.dtype]
        return N * K // 2 + stats + M * K * eb + M * N * eb

    # -- inputs and the gate ---------------------------------------------------------------
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

    # -- launching -----------------------------------------------------------------------
    def plan_for(self, config, inputs: MatmulInputs, limits: DeviceLimits, registers: Optional[int]) -> MatmulPlan:
        N, K, dtype = check_matmul_inputs(inputs.A, inputs.qs, inputs.bias)
        if dtype != config.dtype:
            raise UnsupportedInput(f"A is {dtype}, this variant computes in {config.dtype}")
        if inputs.qs.quant_type != config.quant:
            raise UnsupportedInput(f"quant_state.quant_type is {inputs.qs.quant_type!r}, this variant decodes "
                                   f"{config.quant!r}")
        M = inputs.A.numel() // K
        g = int(inputs.qs.state2.blocksize) if inputs.qs.state2 is not None else 256
        return MatmulPlan(config, M, N, K, int(inputs.qs.blocksize), g, limits, registers, inputs.A.device)

    def launch_args(self, plan: MatmulPlan, inputs: MatmulInputs, out) -> tuple:
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

    # -- what it is judged against ---------------------------------------------------------
    def peers(self, inputs: MatmulInputs, problem: Problem) -> dict:
        """bnb's grad-free ``matmul_4bit`` (what users call: its fused kernel or dequantize +
        F.linear, by its heuristics), and a dense F.linear with the 16-bit weight (what the
        model would cost unquantized)."""
        import torch
        import bitsandbytes as bnb
        import bitsandbytes.functional as F

        A, B, qs, bias = inputs.A, inputs.B, inputs.qs, inputs.bias
        dense = F.dequantize_4bit(B, qs).to(A.dtype)

        def bnb_matmul():
            with torch.no_grad():
                return bnb.matmul_4bit(A, B.t(), qs, bias=bias)

        def dense_linear():
            return torch.nn.functional.linear(A, dense, bias)

        return {REF_BNB_MATMUL: bnb_matmul, REF_DENSE: dense_linear}

    def ceiling(self, inputs: MatmulInputs, problem: Problem):
        """(label, callable, bytes): a read-only reduction of 512 MiB (the read bandwidth)."""
        return REF_READ, read_reduction(inputs.A.device), READ_BYTES


def read_reduction(device, nbytes: int = READ_BYTES):
    """A callable that reads ``nbytes`` once (``torch.sum`` of a float32 buffer into a scalar): the
    family's read-only ceiling at 512 MiB, and a pure read of exactly a problem's bytes."""
    import torch

    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    sink = torch.empty((), dtype=torch.float32, device=buf.device)
    return lambda: torch.sum(buf, dim=0, out=sink)


def _dtype_name(torch_dtype) -> str:
    return {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}[str(torch_dtype)]


MATMUL = MatmulFamily()
