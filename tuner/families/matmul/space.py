"""The matmul family's space: its knobs and the constraints that rule combinations out.

Each knob is one declaration (values, default, refinement rank, experimental values, label, help);
each constraint is a small rule whose docstring (or ``help``) is what ``nf4-tune space`` prints.
The rules are kept to a few knobs each: :mod:`nf4tune.family.space` counts the space from them,
and a rule over many knobs makes that count (and the search space's walk) slow.

Experimental values never won a served table entry (tuner/serve/tuned_configs.json, checked by a
test): the tensor-core path ``mma``, the per-warp and bulk rings (``stages``, ``feed=bulk``), the
register cap, ``prmt_quarters``, the luts ``register`` / ``prmt`` / ``pairf`` / ``pairmix``, one and
eight rows per warp, every value scaled, plain W loads, two groups ahead and span 4; and, of the column
structure ``mma-cols`` (which won an H100 entry at M = 8), the batch tiles ``cols_mb`` 2 and 8 and parts of
32 and 128 values. They stay valid and searchable (``--experimental``); the built-in defaults never use them.
"""

from __future__ import annotations

from ...family import Constraint, Knob
from ...vocabulary import DTYPES, M_BUCKETS, QUANTS
from .resources import bulk_ring_bytes, cols_registers, ks_registers, ring_bytes, rows_registers

__all__ = ["KNOBS", "CONSTRAINTS", "PRESETS", "STRUCTURES", "HEADERS", "PAIR16_LUTS", "DYN_TABLE_LUTS",
           "DYN_TABLE_BYTES", "FLOAT_PAIR_LUTS", "ROWS_LUTS", "ROWS_MAX_LOAD_REGISTERS",
           "ROWS_MAX_LOAD_REGISTERS_TWO_AHEAD", "KS_MAX_LOAD_REGISTERS", "KS_MAX_RING_BYTES", "REGCAPS",
           "COLS_MAX_REGISTERS", "COLS_MAX_TILES", "rounded_codes", "structure"]

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
#: the K-split tensor-core path's registers of loads in flight, at most
KS_MAX_LOAD_REGISTERS = 128
#: the K-split path's shared-memory ring, at most (bytes per CTA)
KS_MAX_RING_BYTES = 160 * 1024
#: mma-cols' registers of its windows (cols_registers: W, the accumulators, A's chunk), at most. NVRTC 13.5, sm_90,
#: 2026-12-07: the M = 1 kernel (76) takes 134 registers; all 552 bf16/nf4 sources this admits compiled without
#: spills (at most 252 registers); of those above it (144 and more) some spilled (255 registers, up to 3.7 KB)
COLS_MAX_REGISTERS = 128
#: mma-cols' n8 tiles per CTA (mtile / cols_mb), at most
COLS_MAX_TILES = 8
#: mma-rows' register caps (the regcap knob; 0: none). Each is the largest count that fits one more warp a
#: register sub-partition (16,384 registers, 256 a warp): 80 fits 6, 72 fits 7 (104-128 fit 4, 96 fits 5,
#: which no CTA size of the warps knob turns into more warps an SM than 16)
REGCAPS = (0, 80, 72)

#: the template files every variant joins first, and each structure's files after them
HEADERS = ("codes.cuh", "matmul/common.cuh")
STRUCTURES = {
    "simt": ("matmul/simt.cu",),
    "mma": ("matmul/mma.cu",),
    "mma-ks": ("matmul/tensor.cuh", "matmul/ks.cuh", "matmul/mma_ks.cu"),
    "mma-ks-bulk": ("matmul/tensor.cuh", "matmul/ks.cuh", "matmul/mma_ks_bulk.cu"),
    "mma-rows": ("matmul/tensor.cuh", "matmul/mma_rows.cu"),
    "mma-cols": ("matmul/mma_cols.cu",),
}


def structure(config) -> str:
    """The structure of ``config``'s source: its mma path, the K-split one with the bulk feed apart."""
    return "mma-ks-bulk" if config.mma == "mma-ks" and config.feed == "bulk" else config.mma


#: the tensor-core paths with W's rows as the mma's M: (name in messages, what rows_per_warp counts,
#: what one scale multiply covers)
_ROW_OPERAND_PATHS = {
    "mma-ks": ("K-split", "rows per CTA", "window and block"),
    "mma-rows": ("row-tile", "rows per warp", "window (a window lies in one block)"),
}


def rounded_codes(config) -> bool:
    """The variant multiplies the codes rounded to the 16-bit activation dtype (the tensor-core paths,
    and SIMT with the 16-bit pair decodes lut prmt / pairx / pairmix, whose odd rows take them), not the exact
    float32 codes."""
    return config.mma != "simt" or config.lut in PAIR16_LUTS


# ----------------------------------------------------------------------------- the rules
def _path_shape(mma, load_bytes, rows_per_warp, mtile, scale, dtype):
    """mma: 16-byte loads, 16/32/64 rows per warp, batch tile 8/16, every value scaled; mma-ks: 16/32 rows
    per CTA, batch tile 8/16, a scale per window and block; mma-rows: 16/32 rows per warp, batch tile
    8/16/32 (64 at 16 rows per warp), a scale per window; mma-cols: load_bytes 16 (not read), 16/32 rows per warp, a scale per (row,
    part); no tensor-core path for fp32. SIMT: at most 32 rows per warp and a batch
    tile of 8, mtile x 2 x load_bytes <= 64 registers of A, rows_per_warp x load_bytes <= 128 bytes in
    flight, mtile x rows_per_warp <= 32 accumulators."""
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
    if mma == "mma-cols":
        if load_bytes != 16:
            return "the column tensor-core path's loads follow part and cols_mb (load_bytes stays 16)"
        if rows_per_warp not in (16, 32):
            return "the column tensor-core path takes 16 or 32 rows per warp (m16 tiles)"
        if scale != "block":
            return "the column tensor-core path scales once per (row, part)"
        if dtype == "fp32":
            return "no tensor-core path for fp32 activations"
        return None
    if mma in _ROW_OPERAND_PATHS:
        path, rows, scaled = _ROW_OPERAND_PATHS[mma]
        if rows_per_warp not in (16, 32):
            return f"the {path} tensor-core path takes 16 or 32 {rows} (m16 tiles)"
        tiles = (8, 16, 32, 64) if mma == "mma-rows" else (8, 16)
        if mtile not in tiles:
            return f"the {path} tensor-core path tiles the batch by {', '.join(map(str, tiles))} (n8 tiles)"
        if mtile == 64 and rows_per_warp != 16:
            return ("the 64-row batch tile takes 16 rows per warp (its sums and a window's partial sums are 64 "
                    "registers at 16 rows)")
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


def _tile_fits_batch(mma, mtile, m, span):
    """simt: mtile <= the batch bucket m; the tensor-core paths: no tile of 16 or more rows that the batch
    fills at most half of; mma-rows with span: mtile / span batch rows per CTA, at least m (W read once);
    mma-cols: mtile == m (W read once, no column left empty)."""
    if mma == "mma-cols":
        if mtile != m:
            return (f"mma-cols takes the batch bucket's rows in one CTA (mtile {m}): mtile {mtile} would "
                    f"{'read W more than once' if mtile < m else 'leave columns empty'}")
        return None
    if mma == "simt" and mtile > m:
        return f"mtile {mtile} exceeds the batch bucket {m}"
    if span > 1 and mma == "mma-rows" and mtile >= 8:
        # a window over span blocks: mtile / span batch rows per CTA (other paths refuse span, _span_path).
        # W read twice, by two batch tiles, was measured on the H200 (2026-12-06) at M = 8: slower than the
        # 16-row tile, 28.5 against 26.8 us at 4096x14336 and 33.0 against 25.2 at 8192x8192
        if mtile // span < m:
            return (f"span {span} leaves {mtile // span} batch rows of mtile {mtile} per CTA, fewer than the batch "
                    f"bucket {m}: W would be read {-(-m // (mtile // span))} times")
        if mtile >= 16 and m <= mtile // span // 2:
            return f"a {mtile}-row batch tile wastes half the tensor core at batch {m} (span {span})"
        return None
    if mma != "simt" and mtile >= 16 and m <= mtile // 2:
        return f"a {mtile}-row batch tile wastes half the tensor core at batch {m}"
    return None


def _prefetch_path(mma, load_bytes, prefetch):
    """prefetch: SIMT, mma-ks and mma-rows (not mma); prefetch 2 (two groups ahead): mma-rows with 16-byte
    loads only."""
    if mma == "mma" and prefetch:
        return "prefetch is a SIMT knob (the tensor-core path keeps its loads for the next window in flight by row tiles)"
    if prefetch == 2 and mma != "mma-rows":
        return "prefetch 2 (two groups ahead) is a knob of the row-tile tensor-core path (mma-rows)"
    if prefetch == 2 and load_bytes != 16:
        return "prefetch 2 (two groups ahead) is for the 16-byte loads of the span loop"
    return None


def _stream_k_shape(mma, persist, rows_per_warp, mtile):
    """mma-rows with persist (stream-K): 16 rows per warp and the 8-row batch tile (its slice function
    runs under a 512-thread launch bound, 128 registers)."""
    # (ksplit is not tied in here: with stream-K it counts the CTAs per resident slot instead, MatmulPlan)
    if mma != "mma-rows" or not persist:
        return None
    if rows_per_warp != 16 or mtile != 8:
        return ("mma-rows with persist (stream-K) takes one 16-row tile per warp and the 8-row batch tile: "
                "larger tiles spill in the loop under its 128-register bound")
    return None


def _warps_path(mma, warps):
    """warps 12, 14, 16: SIMT, mma-rows and mma-cols only."""
    if warps > 8 and mma not in ("simt", "mma-rows", "mma-cols"):
        return f"{warps} warps per CTA: the SIMT, row-tile and column tensor-core paths only"
    return None


def _regcap_path(mma, persist, regcap):
    """regcap 80/72: mma-rows without stream-K (persist 0) only (stream-K's kernel is bound to 512 threads
    by __launch_bounds__, which __maxnreg__ cannot join)."""
    if regcap and (mma != "mma-rows" or persist):
        return "regcap (a register cap) is a knob of the row-tile tensor-core path without stream-K (mma-rows, persist 0)"
    return None


def _achunk_path(mma, achunk):
    """achunk 1: mma-rows only."""
    if achunk and mma != "mma-rows":
        return "achunk (A read a chunk at a time) is a knob of the row-tile tensor-core path (mma-rows) only"
    return None


def _lut_path(mma, lut, dtype):
    """lut prmt / pairx / pairmix (16-bit code pairs): bf16 or fp16, not mma; pairf / pairmix (float pairs):
    SIMT only; mma-rows: pair, pairx or prmt; mma-cols: pairx."""
    if mma == "mma-cols" and lut != "pairx":
        return "the column tensor-core path decodes with lut pairx (its table's upper halves hold the nested code)"
    if mma == "mma-rows" and lut not in ROWS_LUTS:
        return f"the row-tile tensor-core path decodes to 16-bit code pairs ({', '.join(ROWS_LUTS)})"
    if lut in PAIR16_LUTS and (mma == "mma" or dtype == "fp32"):
        return (f"lut {lut} decodes to 16-bit operand pairs: the K-split tensor-core path and SIMT, with bf16 or "
                "fp16 activations")
    if lut in FLOAT_PAIR_LUTS and mma != "simt":
        return f"lut {lut} decodes to float pairs for the FMAs: the SIMT path only"
    return None


def _prmt_mix(mma, lut, load_bytes, prmt_quarters):
    """prmt_quarters 1/2: mma-rows with lut pairx and 8- or 16-byte loads only."""
    if prmt_quarters and (mma != "mma-rows" or lut != "pairx"):
        return "prmt_quarters mixes lut prmt into lut pairx's decode on the row-tile tensor-core path (mma-rows) only"
    if prmt_quarters and load_bytes < 8:
        return "prmt_quarters splits a load's byte pairs in quarters: 8- or 16-byte loads (a 4-byte load has two)"
    return None


def _span_path(mma, span):
    """span 2/4 (a window over several blocks): mma-rows only."""
    if span != 1 and mma != "mma-rows":
        return "span (a window over several blocks) is a knob of the row-tile tensor-core path (mma-rows)"
    return None


def _ks_knobs(mma, unroll, persist, stages, feed, stats):
    """unroll and persist: mma-ks and mma-rows only; stages, feed and stats: mma-ks only."""
    if mma == "mma-rows" and (stages or feed != "lanes" or stats != "lanes"):
        return "stages, feed and stats are knobs of the K-split tensor-core path (mma-ks)"
    if mma not in ("mma-ks", "mma-rows") and (unroll != 1 or persist or stages or feed != "lanes" or stats != "lanes"):
        return ("unroll, persist, stages, feed and stats are knobs of the K-split tensor-core path (unroll and "
                "persist also of mma-rows)")
    return None


def _astage_path(mma, astage):
    """mma-rows and mma-cols stage A in shared memory (astage shared); mma-ks reads it per window (astage
    global)."""
    if mma in ("mma-rows", "mma-cols") and astage != "shared":
        return f"the {'row-tile' if mma == 'mma-rows' else 'column'} tensor-core path stages A in shared memory (astage shared)"
    if mma == "mma-ks" and astage != "global":
        return "the K-split tensor-core path reads its run of A per window (no shared staging)"
    return None


def _rows_span_parts(mma, load_bytes, span):
    """mma-rows: a window's span parts hold at least 32 values (8 x load_bytes >= 32 x span)."""
    if mma == "mma-rows" and 8 * load_bytes < 32 * span:
        return (f"span {span}: a window of {8 * load_bytes} values in {span} parts of fewer than 32 values "
                "(the smallest blocksize) never needs it")
    return None


def _rows_load_registers(mma, load_bytes, rows_per_warp, unroll, prefetch, span):
    if mma != "mma-rows":
        return None
    regs = rows_registers(load_bytes, rows_per_warp, unroll, prefetch, span)
    limit = ROWS_MAX_LOAD_REGISTERS_TWO_AHEAD if prefetch == 2 else ROWS_MAX_LOAD_REGISTERS
    if regs > limit:
        return f"{regs} registers of loads in flight exceed {limit} (mma-rows{', prefetch 2' if prefetch == 2 else ''})"
    return None


def _ks_feed(mma, stages, feed, stats):
    """mma-ks: the bulk feed needs stages and takes stats lanes; the per-warp ring (feed lanes) takes 4
    stages."""
    if mma != "mma-ks":
        return None
    if stats == "tile" and feed == "bulk":
        return "the tile's scale table (stats tile) is not a structure of the bulk feed (it copies the statistics)"
    if feed == "bulk" and not stages:
        return "the bulk feed fills a shared-memory ring: it needs stages"
    if feed == "lanes" and stages == 2:
        return "the per-warp ring takes 4 stages (2 lost everywhere on the H200)"
    return None


def _ks_reduction(mma, warps, rows_per_warp, mtile):
    """mma-ks: warps x rows x mtile <= 2048 partial sums (the 8 KiB reduction buffer)."""
    if mma == "mma-ks" and warps * rows_per_warp * mtile > 2048:
        return f"warps*rows*mtile = {warps * rows_per_warp * mtile} partial sums exceed the 8 KiB reduction buffer"
    return None


def _ks_ring_groups(mma, stages, prefetch, unroll):
    """mma-ks with the ring (stages): no register prefetch, groups of 1 or 2 windows."""
    if mma != "mma-ks" or not stages:
        return None
    if prefetch:
        return "the shared-memory ring (stages) replaces the register prefetch"
    if unroll > 2:
        return "the shared-memory ring takes groups of 1 or 2 windows (its depth is the stages)"
    return None


def _ks_load_registers(mma, load_bytes, rows_per_warp, mtile, unroll, prefetch, stages, feed, stats):
    if mma != "mma-ks":
        return None
    regs = ks_registers(load_bytes, rows_per_warp, mtile, unroll, prefetch, stages, feed, stats)
    if regs > KS_MAX_LOAD_REGISTERS:
        return f"{regs} registers of loads in flight exceed {KS_MAX_LOAD_REGISTERS}"
    return None


def _ks_ring_bytes(mma, load_bytes, rows_per_warp, mtile, warps, unroll, stages, feed, stats):
    if mma != "mma-ks":
        return None
    if feed == "bulk":
        ring = bulk_ring_bytes(load_bytes, rows_per_warp, unroll, stages, warps, mtile)
    else:
        ring = ring_bytes(load_bytes, rows_per_warp, unroll, stages, warps, stats)
    if ring > KS_MAX_RING_BYTES:
        return f"a ring of {ring} bytes exceeds {KS_MAX_RING_BYTES // 1024} KiB of shared memory per CTA"
    return None


def _cols_knobs(mma, cols_mb, part, table64):
    """cols_mb, part and table64: mma-cols only (elsewhere their defaults 1, 64, 1)."""
    if mma != "mma-cols" and (cols_mb != 1 or part != 64 or table64 != 1):
        return "cols_mb, part and table64 are knobs of the column tensor-core path (mma-cols)"
    return None


def _cols_tile(mma, mtile, cols_mb):
    """mma-cols: mtile = cols_mb x n8 tiles, 1 to 8 tiles, at most 32 batch rows (the 64-row tile is
    mma-rows')."""
    if mma != "mma-cols":
        return None
    if mtile > 32:
        return f"mma-cols takes at most 32 batch rows per CTA, not mtile {mtile} (the 64-row tile is mma-rows')"
    if mtile % cols_mb:
        return f"mma-cols: mtile {mtile} is not a whole number of n8 tiles of cols_mb {cols_mb} batch rows"
    if mtile // cols_mb > COLS_MAX_TILES:
        return f"mma-cols: mtile {mtile} / cols_mb {cols_mb} = {mtile // cols_mb} n8 tiles exceed {COLS_MAX_TILES}"
    return None


def _cols_registers(mma, rows_per_warp, mtile, prefetch, cols_mb, part):
    if mma != "mma-cols":
        return None
    regs = cols_registers(part, cols_mb, rows_per_warp, prefetch, mtile)
    if regs > COLS_MAX_REGISTERS:
        return f"{regs} registers of windows (W, sums, A) exceed {COLS_MAX_REGISTERS} (mma-cols)"
    return None


KNOBS = (
    Knob("mma", ("simt", "mma", "mma-ks", "mma-rows", "mma-cols"), refine=8, experimental=("mma",),
         help="simt: fp32 FMAs on CUDA cores; mma: tensor cores (mma.sync m16n8k16, batch padded to 8/16), "
              "a warp per row tile; mma-ks: tensor cores with W rows as the mma's M, the CTA's warps "
              "splitting K, 16-bit code pairs and one scale multiply per block; mma-rows: mma-ks's "
              "operands and decode, each warp owning its row tiles over the CTA's K slice, A staged in "
              "shared memory once per CTA, a window's statistics loaded once per row; mma-cols: the mma's n8 "
              "columns are (part of K, batch row) pairs, so each (row, block) is scaled once per window and no "
              "column is padding at M = 1"),
    Knob("load_bytes", (4, 8, 16), default=16, refine=6, label="{}B",
         help="bytes of W one lane loads per row per step (8, 16 or 32 values)"),
    Knob("rows_per_warp", (1, 2, 4, 8, 16, 32, 64), default=4, refine=2, experimental=(1, 8, 64), label="r{}",
         help="rows of W per warp (SIMT: loads in flight; MMA: m16 tiles), all reusing one load of A"),
    Knob("mtile", (1, 2, 4, 8, 16, 32, 64), refine=7, experimental=(64,), label="m{}",
         help="rows of A per CTA (64: mma-rows only, 8 n8 tiles: W read once at M = 64, or at M = 32 with span 2)"),
    Knob("warps", (1, 2, 4, 8, 12, 14, 16), "launch", default=4, refine=1, label="w{}",
         help="warps per CTA (12, 14, 16: SIMT, mma-rows and mma-cols only, one pair table and one stage of A for more "
              "warps; 12 and 14 change how many rows a wave of resident CTAs covers, and so the last wave's fill)"),
    Knob("ksplit", (1, 2, 4, 8, 16), "launch", refine=0, label="k/{}",
         help="split-K: slices of K over CTAs, summed by fp32 atomics, the last CTA finishing the tile; "
              "mma-rows with persist (stream-K): CTAs per resident slot (its runs are that much shorter)"),
    Knob("lut", ("shared", "register", "pair", "prmt", "pairx", "pairf", "pairmix"), refine=9,
         experimental=("register", "prmt", "pairf", "pairmix"),
         help="the 16-entry code in shared memory, a select tree in registers, a 256-entry table of "
              "code pairs (one lookup per byte), replicated per lane phase (32 KiB), or (bf16/fp16, mma-ks "
              "and SIMT) the codes as 16-bit byte tables in registers, four nibbles per byte permute (no "
              "memory), or the 16-bit pair table with 256-byte rows (64 KiB): a lookup's offset is one byte "
              "permute; pairf (SIMT): the float pair table with 256-byte rows (64 KiB), a permute and an "
              "8-byte load per packed byte, the exact codes; pairmix (SIMT, bf16/fp16): both in one 64 KiB "
              "table, even rows through the float pairs, odd rows through the 16-bit pairs"),
    Knob("astage", ("global", "shared"), refine=10, label="A:{}",
         help="A read per step from global memory (L1/L2), or staged once per CTA in shared memory"),
    Knob("scale", ("value", "block"), default="block", refine=5, experimental=("value",), label="s:{}",
         help="scale every weight, or the sum of a lane's run once (SIMT)"),
    Knob("wload", ("plain", "stream"), default="stream", refine=4, experimental=("plain",),
         help="plain loads of W, or streaming (ld.global.nc.L1::no_allocate)"),
    Knob("prefetch", (0, 1, 2), refine=3, experimental=(2,), label="pf{}",
         help="SIMT, mma-ks and mma-rows: load the next step's W and statistics before computing the current one; "
              "2 (mma-rows, 16-byte loads): two groups ahead"),
    Knob("unroll", (1, 2, 4), label="u{}",
         help="mma-ks, mma-rows: windows of K whose loads are all issued before the first is used"),
    Knob("span", (1, 2, 4), experimental=(4,), label="sp{}", hidden=(1,),
         help="mma-rows: blocks a window (8 x load_bytes values) spans; 2 and 4 give each block's part of "
              "the window its own columns of the mma's n8 (8 / span batch rows per n8 tile), so 16-byte "
              "loads work at blocksize 64 with one mma per window; must equal 8 x load_bytes / blocksize "
              "(at least 1) of the problem"),
    Knob("prmt_quarters", (0, 1, 2), experimental=True, label="pq{}", hidden=(0,),
         help="mma-rows with lut pairx: quarters of the packed bytes decoded by lut prmt's byte permutes "
              "(ALU only) instead of the pair table's shared loads, which share the L1 pipe with W's loads"),
    Knob("persist", (0, 1), label="p{}",
         help="mma-ks: a few CTAs per SM loop over the row tiles (tables filled once per CTA); mma-rows: "
              "stream-K: as many CTAs as are resident at once (times ksplit), each an equal run of the (row "
              "tile, group of K) units, a tile cut between CTAs summed in the split-K workspace"),
    Knob("stages", (0, 2, 4), experimental=True, label="st{}",
         help="mma-ks: 0 loads W into registers; N stages W through a shared-memory ring N deep (feed: "
              "per warp by the lanes' cp.async, 4 only; or per CTA by a producer warp's bulk copies)"),
    Knob("feed", ("lanes", "bulk"), experimental=("bulk",),
         help="mma-ks with stages: lanes: each lane copies its own bytes into its warp's ring; bulk: a "
              "producer warp copies each chunk (W and A rows by cp.async.bulk, sm_90+, and the statistics) "
              "into a ring the CTA's warps share, mbarrier-guarded: the other warps only read shared memory"),
    Knob("stats", ("lanes", "tile"), label="stats:{}",
         help="mma-ks, register feed or per-warp ring: lanes: every lane loads (or copies) and decodes its "
              "rows' statistics with each window; tile: the CTA decodes the row tile's scales for its K slice "
              "into shared memory first (each block once), a lane's scale is then one shared-memory load"),
    Knob("regcap", REGCAPS, experimental=True, label="rc{}", hidden=(0,),
         help="mma-rows without stream-K: 0 no cap; N: at most N registers a thread (__maxnreg__), so that "
              "more warps fit an SM (80: 6 warps a register sub-partition, 72: 7, against 4 at 104-128); "
              "spills go to local memory"),
    Knob("achunk", (0, 1), label="ac{}", hidden=(0,),
         help="mma-rows: 0 a window's runs of A read from shared memory at once (load_bytes registers a "
              "batch tile of 8 rows); 1 one 16-byte chunk at a time, just before its two k-steps (4 registers "
              "a batch tile): fewer registers, so more warps an SM, the same sums bit for bit"),
    Knob("cols_mb", (1, 2, 4, 8), experimental=(2, 8), label="mb{}", hidden=(1,),
         help="mma-cols: batch rows per n8 tile; its 8 columns are 8 / cols_mb parts of K x cols_mb batch rows "
              "(1 at M = 1: 8 parts a window, no column is padding)"),
    Knob("part", (32, 64, 128), default=64, experimental=True, label="P{}", hidden=(64,),
         help="mma-cols: values of K per part (a column's share of a window); the plan serves it at blocksize "
              "== part, so each part is one block, scaled once"),
    Knob("table64", (1, 0), label="t64:{}", hidden=(1,),
         help="mma-cols: 1: the pair table at a 64 KiB-aligned shared address, so one byte permute gives a "
              "lookup's whole address (128 KiB of shared memory: one CTA an SM); 0: the table first, its "
              "base added to each lookup's offset"),
    Knob("pdl", (0, 1), experimental=True, label="pdl{}", hidden=(0,),
         help="1: programmatic dependent launch (sm_90+): the kernel reads only W, its statistics and its tables "
              "before a griddepcontrol.wait, so launched with programmatic stream serialization (the runtime "
              "with NF4TUNE_PDL=1) its prologue overlaps the end of the kernel before it; launched plainly (the "
              "benchmark harness) the wait returns at once"),
    Knob("dtype", DTYPES, "problem", default="bf16", help="activation (and output) dtype"),
    Knob("quant", QUANTS, "problem", default="nf4", help="4-bit code: nf4 or fp4"),
    Knob("m", M_BUCKETS, "problem", default=1, in_source=False, label="",
         help="the batch bucket the config is tuned for (not in the source)"),
)

CONSTRAINTS = (
    Constraint(("mma", "load_bytes", "rows_per_warp", "mtile", "scale", "dtype"), _path_shape),
    Constraint(("mma", "mtile", "m", "span"), _tile_fits_batch),
    Constraint(("mma", "load_bytes", "prefetch"), _prefetch_path),
    Constraint(("mma", "persist", "rows_per_warp", "mtile"), _stream_k_shape),
    Constraint(("mma", "warps"), _warps_path),
    Constraint(("mma", "persist", "regcap"), _regcap_path),
    Constraint(("mma", "achunk"), _achunk_path),
    Constraint(("mma", "lut", "dtype"), _lut_path),
    Constraint(("mma", "lut", "load_bytes", "prmt_quarters"), _prmt_mix),
    Constraint(("mma", "span"), _span_path),
    Constraint(("mma", "unroll", "persist", "stages", "feed", "stats"), _ks_knobs),
    Constraint(("mma", "stages", "feed", "stats"), _ks_feed),
    Constraint(("mma", "astage"), _astage_path),
    Constraint(("mma", "cols_mb", "part", "table64"), _cols_knobs),
    Constraint(("mma", "mtile", "cols_mb"), _cols_tile),
    Constraint(("mma", "rows_per_warp", "mtile", "prefetch", "cols_mb", "part"), _cols_registers,
               help=f"mma-cols: the windows' registers (cols_registers: W, sums, A) <= {COLS_MAX_REGISTERS}"),
    Constraint(("mma", "load_bytes", "span"), _rows_span_parts),
    Constraint(("mma", "load_bytes", "rows_per_warp", "unroll", "prefetch", "span"), _rows_load_registers,
               help=f"mma-rows: loads in flight (rows_registers) <= {ROWS_MAX_LOAD_REGISTERS} registers, "
                    f"{ROWS_MAX_LOAD_REGISTERS_TWO_AHEAD} with prefetch 2"),
    Constraint(("mma", "warps", "rows_per_warp", "mtile"), _ks_reduction),
    Constraint(("mma", "stages", "prefetch", "unroll"), _ks_ring_groups),
    Constraint(("mma", "load_bytes", "rows_per_warp", "mtile", "unroll", "prefetch", "stages", "feed", "stats"),
               _ks_load_registers,
               help=f"mma-ks: loads in flight (ks_registers) <= {KS_MAX_LOAD_REGISTERS} registers"),
    Constraint(("mma", "load_bytes", "rows_per_warp", "mtile", "warps", "unroll", "stages", "feed", "stats"),
               _ks_ring_bytes,
               help=f"mma-ks: the ring (ring_bytes, or bulk_ring_bytes with the bulk feed) <= "
                    f"{KS_MAX_RING_BYTES // 1024} KiB per CTA"),
)

PRESETS = {
    # bnb's gemm_4bit_simt: one warp per row, 4 warps per CTA, 32 values per lane per step (experimental
    # values: bnb's own structure is the reference, not a contender)
    "bnb-like": dict(mma="simt", load_bytes=16, rows_per_warp=1, mtile=1, warps=4, ksplit=1, lut="shared",
                     astage="global", scale="value", wload="plain", prefetch=0),
}
