"""GPU tests of the matmul family: the gate on every path (SIMT and tensor cores, each dtype,
nf4 and fp4, nested and plain statistics, split-K, odd sizes), its teeth (a wrong kernel is
rejected), the runtime and the bnb patch (only where faster, bnb elsewhere), CUDA graphs and
torch.compile."""

import json

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
import bitsandbytes as bnb
import bitsandbytes.functional as F

from nf4tune.families import MATMUL as MM
from nf4tune.families.matmul import gamma, rows_span
from nf4tune.kernel.launch import LoadedKernel
from nf4tune.measure.gate import check_config
from nf4tune.vocabulary import Problem

T = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def P(n, k, m, dtype="bf16", quant="nf4", bs=64):
    return Problem((n, k), dtype, quant, bs, "matmul", m)


CONFIGS = [
    # SIMT: every load width, scale mode, LUT, A staging, W load, split-K
    (1, dict(load_bytes=16, rows_per_warp=4, mtile=1, warps=4, ksplit=1)),
    (1, dict(load_bytes=16, rows_per_warp=8, mtile=1, warps=2, ksplit=4, scale="value", wload="plain")),
    (1, dict(load_bytes=8, rows_per_warp=16, mtile=1, warps=8, ksplit=2, lut="register", astage="shared")),
    (2, dict(load_bytes=16, rows_per_warp=2, mtile=2, warps=4, ksplit=8)),
    (4, dict(load_bytes=8, rows_per_warp=4, mtile=4, warps=4, ksplit=2, astage="shared")),
    (8, dict(load_bytes=4, rows_per_warp=4, mtile=8, warps=4, ksplit=1)),
    # tensor cores: both batch tiles, row tiles, split-K
    (8, dict(mma="mma", rows_per_warp=16, mtile=8, warps=4, ksplit=1, scale="value")),
    (16, dict(mma="mma", rows_per_warp=32, mtile=16, warps=2, ksplit=4, scale="value", astage="shared")),
    (64, dict(mma="mma", rows_per_warp=64, mtile=16, warps=4, ksplit=2, scale="value", lut="register")),
    # tensor cores, K over the warps: every load width (windows of 1, 2 and 4 blocks at blocksize 32),
    # every LUT, prefetch, unroll, persistent CTAs, split-K over CTAs
    (1, dict(mma="mma-ks", load_bytes=8, rows_per_warp=16, mtile=8, warps=4, ksplit=1, scale="block", lut="pair",
             unroll=2, prefetch=1)),
    (1, dict(mma="mma-ks", load_bytes=16, rows_per_warp=32, mtile=8, warps=2, ksplit=4, scale="block",
             lut="shared", persist=1)),
    (4, dict(mma="mma-ks", load_bytes=4, rows_per_warp=16, mtile=8, warps=8, ksplit=2, scale="block",
             lut="register", unroll=4, persist=1, wload="plain")),
    (16, dict(mma="mma-ks", load_bytes=8, rows_per_warp=16, mtile=16, warps=4, ksplit=1, scale="block", lut="pair",
              unroll=2, prefetch=1, persist=1)),
    # ... W and its statistics staged through the shared-memory ring (cp.async): every copy width,
    # evict-first and plain copies, groups of two windows, persistent CTAs, split-K; the first needs
    # more than 48 KiB of shared memory (opt-in)
    (1, dict(mma="mma-ks", load_bytes=16, rows_per_warp=16, mtile=8, warps=8, ksplit=1, scale="block", lut="pair",
             stages=4)),
    (1, dict(mma="mma-ks", load_bytes=8, rows_per_warp=32, mtile=8, warps=4, ksplit=2, scale="block", lut="shared",
             stages=4, unroll=2, wload="plain")),
    (8, dict(mma="mma-ks", load_bytes=4, rows_per_warp=16, mtile=8, warps=4, ksplit=1, scale="block",
             lut="register", stages=4, persist=1)),
    (32, dict(mma="mma-ks", load_bytes=16, rows_per_warp=32, mtile=16, warps=4, ksplit=4, scale="block", lut="pair",
              stages=4)),
    # ... the byte-permute decode (codes in registers): register loads, and the ring
    (1, dict(mma="mma-ks", load_bytes=8, rows_per_warp=32, mtile=8, warps=8, ksplit=1, scale="block", lut="prmt",
             unroll=2)),
    (16, dict(mma="mma-ks", load_bytes=16, rows_per_warp=16, mtile=16, warps=4, ksplit=2, scale="block", lut="prmt",
              stages=4)),
    # ... the bulk feed (a producer warp, cp.async.bulk, mbarriers): every load width, groups of one
    # and two windows, rings of 2 and 4 chunks, evict-first and plain copies, split-K (the epilogue
    # without the producer), persistent CTAs, both batch tiles, every LUT
    (1, dict(mma="mma-ks", load_bytes=8, rows_per_warp=32, mtile=8, warps=8, ksplit=1, scale="block", lut="pair",
             unroll=2, stages=4, feed="bulk")),
    (1, dict(mma="mma-ks", load_bytes=16, rows_per_warp=16, mtile=8, warps=4, ksplit=2, scale="block",
             lut="shared", stages=4, feed="bulk", wload="plain")),
    (8, dict(mma="mma-ks", load_bytes=4, rows_per_warp=16, mtile=8, warps=8, ksplit=1, scale="block",
             lut="register", stages=2, feed="bulk", persist=1)),
    (16, dict(mma="mma-ks", load_bytes=8, rows_per_warp=32, mtile=16, warps=4, ksplit=4, scale="block", lut="prmt",
              stages=4, feed="bulk")),
    # ... the permute-addressed pair table (64 KiB of dynamic shared memory): register loads, and the
    # bulk feed
    (1, dict(mma="mma-ks", load_bytes=8, rows_per_warp=32, mtile=8, warps=8, ksplit=1, scale="block", lut="pairx",
             unroll=2)),
    (16, dict(mma="mma-ks", load_bytes=16, rows_per_warp=16, mtile=16, warps=4, ksplit=2, scale="block",
              lut="pairx", stages=2, feed="bulk", persist=1)),
    # ... the tile's scale table (stats tile, register feed): every load width (windows of 1, 2 and 4
    # blocks at blocksize 32), prefetch of the next tile, persistent CTAs, split-K, both batch tiles
    (1, dict(mma="mma-ks", load_bytes=8, rows_per_warp=32, mtile=8, warps=8, ksplit=1, scale="block", lut="pairx",
             unroll=2, stats="tile")),
    (1, dict(mma="mma-ks", load_bytes=16, rows_per_warp=16, mtile=8, warps=4, ksplit=4, scale="block", lut="pair",
             prefetch=1, persist=1, stats="tile")),
    (4, dict(mma="mma-ks", load_bytes=4, rows_per_warp=32, mtile=8, warps=8, ksplit=2, scale="block",
             lut="register", unroll=4, stats="tile", wload="plain")),
    (16, dict(mma="mma-ks", load_bytes=8, rows_per_warp=16, mtile=16, warps=4, ksplit=1, scale="block", lut="prmt",
              unroll=2, prefetch=1, persist=1, stats="tile")),
    # ... and with the per-warp ring (W only through it): groups of one and two windows, split-K,
    # persistent CTAs, both batch tiles
    (1, dict(mma="mma-ks", load_bytes=8, rows_per_warp=32, mtile=8, warps=8, ksplit=2, scale="block", lut="pairx",
             stages=4, stats="tile")),
    (16, dict(mma="mma-ks", load_bytes=16, rows_per_warp=16, mtile=16, warps=4, ksplit=1, scale="block",
              lut="register", stages=4, unroll=2, persist=1, stats="tile", wload="plain")),
    # SIMT with the 16-bit pair decodes (codes rounded to the activation dtype, turned into floats):
    # the pair table in dynamic shared memory before A's staging, split-K, the batch tile; the
    # byte-permute decode with the register prefetch and every value scaled
    (2, dict(load_bytes=8, rows_per_warp=4, mtile=2, warps=4, ksplit=2, lut="pairx", astage="shared")),
    (1, dict(load_bytes=16, rows_per_warp=4, mtile=1, warps=2, ksplit=1, lut="pairx", prefetch=1)),
    (1, dict(load_bytes=16, rows_per_warp=4, mtile=1, warps=2, ksplit=1, lut="prmt", prefetch=1, scale="value")),
    # SIMT with A staged lane-major in shared memory: 16-byte loads (four chunks per run, eight for
    # fp32), 16-warp CTAs, the pair table before the stage, split-K with a partial last step, the batch tile
    (1, dict(load_bytes=16, rows_per_warp=4, mtile=1, warps=16, ksplit=1, lut="pairx", astage="shared", prefetch=1)),
    (2, dict(load_bytes=16, rows_per_warp=4, mtile=2, warps=16, ksplit=2, astage="shared")),
    # SIMT with the float pair table (pairf, 64 KiB of dynamic shared memory, every dtype): before A's
    # lane-major stage with 16-warp CTAs and the prefetch; with A read per step, every value scaled,
    # 8-byte loads, the batch tile and split-K
    (1, dict(load_bytes=16, rows_per_warp=4, mtile=1, warps=16, ksplit=1, lut="pairf", astage="shared", prefetch=1)),
    (2, dict(load_bytes=8, rows_per_warp=8, mtile=2, warps=4, ksplit=2, lut="pairf", scale="value")),
    # SIMT CTAs of 12 and 14 warps (not a power of two): rows per CTA 56 and 48 against odd N, split-K
    # with A staged, the batch tile
    (1, dict(load_bytes=16, rows_per_warp=4, mtile=1, warps=14, ksplit=2, lut="pairx", astage="shared")),
    (2, dict(load_bytes=8, rows_per_warp=2, mtile=2, warps=12, ksplit=1, lut="shared")),
    # SIMT with the mixed pair table (pairmix: float pairs for even rows, 16-bit pairs for odd ones): A
    # staged with 14-warp CTAs and split-K; A read per step, every value scaled, 8-byte loads, the batch tile
    (1, dict(load_bytes=16, rows_per_warp=4, mtile=1, warps=14, ksplit=2, lut="pairmix", astage="shared")),
    (2, dict(load_bytes=8, rows_per_warp=8, mtile=2, warps=4, ksplit=1, lut="pairmix", scale="value", prefetch=1)),
    # tensor cores with warps owning row tiles (mma-rows: A staged in the operand order, a group's statistics
    # shared by the quad): 14- and 16-warp CTAs against odd N (a warp past N, one partly past it), windows of
    # 32 and 64 values (the 64-value ones refused at blocksize 32), groups of 1, 2 and 4 windows with and
    # without the prefetch, both tables, split-K with a partial last group, 32-row warps, the 16-row batch
    # tile, a batch tile only partly filled
    (1, dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=8, warps=14, ksplit=1, scale="block",
             lut="pairx", astage="shared", unroll=2, prefetch=1)),
    (1, dict(mma="mma-rows", load_bytes=4, rows_per_warp=16, mtile=8, warps=16, ksplit=4, scale="block",
             lut="pair", astage="shared", unroll=4, prefetch=1, wload="plain")),
    (8, dict(mma="mma-rows", load_bytes=4, rows_per_warp=32, mtile=8, warps=4, ksplit=2, scale="block",
             lut="pairx", astage="shared", unroll=1)),
    (16, dict(mma="mma-rows", load_bytes=4, rows_per_warp=16, mtile=16, warps=8, ksplit=2, scale="block",
              lut="pair", astage="shared", unroll=2, prefetch=1)),
    (4, dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=8, warps=16, ksplit=1, scale="block",
             lut="pairx", astage="shared", unroll=4)),
    # ... with windows over several blocks (span: each block's part in its own batch columns): 16-byte loads
    # at blocksize 64 (groups of 1 and 2 windows, the prefetch, split-K with a partial last group, 32-row
    # warps, 4 batch rows in an n8, the 16-row batch tile at batch 8), 8-byte loads at blocksize 32 with
    # groups of 4 (two statistics slots per lane), and span 4 (16-byte loads at blocksize 32, 2 batch rows)
    (1, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=14, ksplit=1, scale="block",
             lut="pairx", astage="shared", unroll=2, prefetch=1, span=2)),
    (1, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=16, ksplit=4, scale="block",
             lut="pair", astage="shared", unroll=1, span=2, wload="plain")),
    (4, dict(mma="mma-rows", load_bytes=16, rows_per_warp=32, mtile=8, warps=4, ksplit=2, scale="block",
             lut="pairx", astage="shared", unroll=1, prefetch=1, span=2)),
    (8, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=16, warps=8, ksplit=1, scale="block",
             lut="pair", astage="shared", unroll=2, prefetch=1, span=2)),
    (2, dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=8, warps=8, ksplit=2, scale="block",
             lut="pairx", astage="shared", unroll=4, span=2)),
    (2, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=8, ksplit=1, scale="block",
             lut="pairx", astage="shared", unroll=2, span=4)),
    # ... with the byte-permute decode (codes in registers, no table): span 2 with the prefetch, and 8-byte
    # loads in one block with split-K at batch 8
    (1, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=16, ksplit=1, scale="block",
             lut="prmt", astage="shared", unroll=1, prefetch=1, span=2)),
    (8, dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=8, warps=8, ksplit=2, scale="block",
             lut="prmt", astage="shared", unroll=2, prefetch=1)),
    # ... with part of pairx's decode moved to prmt's permutes (prmt_quarters): span 2 at batch 1 and with the
    # 16-row batch tile and split-K at batch 8, and 8-byte loads in one block
    (1, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=16, ksplit=1, scale="block",
             lut="pairx", astage="shared", unroll=2, prefetch=1, span=2, prmt_quarters=1)),
    (8, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=16, warps=14, ksplit=2, scale="block",
             lut="pairx", astage="shared", unroll=2, prefetch=1, span=2, prmt_quarters=2)),
    (4, dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=8, warps=8, ksplit=1, scale="block",
             lut="pairx", astage="shared", unroll=4, prmt_quarters=1)),
    # ... two groups ahead (prefetch 2): the span loop at batch 1 with 16 warps, the 16-row batch tile with
    # split-K at batch 8, and groups of one window in slices of one group at the gate's K = 2048 (split-K 16:
    # nothing ahead to load)
    (1, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=16, ksplit=1, scale="block",
             lut="pairx", astage="shared", unroll=2, prefetch=2, span=2)),
    (8, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=16, warps=8, ksplit=2, scale="block",
             lut="pairx", astage="shared", unroll=2, prefetch=2, span=2)),
    (2, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=8, ksplit=16, scale="block",
             lut="pair", astage="shared", unroll=1, prefetch=2, span=2)),
    # ... stream-K (persist: as many CTAs as are resident, each an even run of (row tile, group) units, tiles cut
    # between CTAs summed in the workspace): the served span shape with 16 warps, 8-byte loads in one block with
    # groups of 4, the plain table and two CTAs per resident slot (ksplit 2), the permute decode at batch 4
    (1, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=16, ksplit=1, scale="block",
             lut="pairx", astage="shared", unroll=2, prefetch=1, span=2, persist=1)),
    (2, dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=8, warps=8, ksplit=2, scale="block",
             lut="pair", astage="shared", unroll=4, persist=1)),
    (4, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=4, ksplit=1, scale="block",
             lut="prmt", astage="shared", unroll=1, prefetch=1, span=2, persist=1, wload="plain")),
    # ... the 32-row batch tile (4 n8 tiles, session 20): 16 batch rows of span 2 at batch 16 with split-K, 32 of
    # span 1 at batch 32, and two tiles of 32 at batch 64 (the gate's batch below each tile's multiple)
    (16, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=32, warps=8, ksplit=2, scale="block",
              lut="pairx", astage="shared", unroll=2, prefetch=1, span=2)),
    (32, dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=32, warps=4, ksplit=2, scale="block",
              lut="pair", astage="shared", unroll=2)),
    (64, dict(mma="mma-rows", load_bytes=8, rows_per_warp=32, mtile=32, warps=8, ksplit=4, scale="block",
              lut="pairx", astage="shared", unroll=1, prefetch=1)),
    # ... with a register cap (regcap, session 24): the served M = 16 shape of the H100 (8-byte loads, unroll 4,
    # no prefetch) at 80 registers (it spills), and unroll 2 with the prefetch at 72 at batch 8
    (16, dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=16, warps=12, ksplit=2, scale="block",
              lut="pair", astage="shared", unroll=4, regcap=80)),
    (8, dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=8, warps=8, ksplit=2, scale="block",
             lut="pairx", astage="shared", unroll=2, prefetch=1, regcap=72)),
    # ... with A read a chunk at a time (achunk, session 25): the served M = 16 shape of the H100, the 16-byte
    # span-2 32-row batch tile at batch 16 (8 warps: without achunk its 182-184 registers fit no more), the served
    # M = 8 span-2 shape with a register cap, and the span-2 loop with stream-K at batch 1
    (16, dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=16, warps=14, ksplit=2, scale="block",
              lut="pair", astage="shared", unroll=4, achunk=1)),
    (16, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=32, warps=8, ksplit=2, scale="block",
              lut="pairx", astage="shared", unroll=2, prefetch=1, span=2, achunk=1)),
    (8, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=16, warps=14, ksplit=1, scale="block",
             lut="pairx", astage="shared", unroll=2, prefetch=1, span=2, achunk=1, regcap=80)),
    (1, dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=16, ksplit=1, scale="block",
             lut="pairx", astage="shared", unroll=2, prefetch=1, span=2, persist=1, achunk=1)),
]
#: the stream-K configs
STREAM_K_CONFIGS = [i for i, (_, k) in enumerate(CONFIGS) if k.get("mma") == "mma-rows" and k.get("persist")]
#: the configs that mix prmt into pairx's decode
PRMTQ_CONFIGS = [i for i, (_, k) in enumerate(CONFIGS) if k.get("prmt_quarters", 0)]
#: the configs that load two groups ahead
AHEAD2_CONFIGS = [i for i, (_, k) in enumerate(CONFIGS) if k.get("prefetch", 0) == 2]
#: the configs with a register cap
REGCAP_CONFIGS = [i for i, (_, k) in enumerate(CONFIGS) if k.get("regcap", 0)]
#: the configs that read A a chunk at a time
ACHUNK_CONFIGS = [i for i, (_, k) in enumerate(CONFIGS) if k.get("achunk", 0)]
#: the configs with windows over several blocks (span > 1), each served at one blocksize
SPAN_CONFIGS = [i for i, (_, k) in enumerate(CONFIGS) if k.get("span", 1) > 1]


@pytest.mark.parametrize("m, knobs", CONFIGS, ids=[f"m{m}-{i}" for i, (m, _) in enumerate(CONFIGS)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_every_path_passes_the_gate(seed, m, knobs, dtype):
    if knobs.get("mma", "simt") != "simt" and dtype == "fp32":
        pytest.skip("no tensor-core path for fp32")
    if knobs.get("lut") in ("prmt", "pairx", "pairmix") and dtype == "fp32":
        pytest.skip("no 16-bit code pairs for fp32")
    for quant, bs in (("nf4", 64), ("fp4", 128), ("nf4", 32)):
        prob = P(1000, 2048, m, dtype, quant, bs)
        c = MM.config(**knobs, dtype=dtype, quant=quant, m=m)
        r = check_config(c, prob, seed=seed)
        if c.mma == "mma-rows" and c.span != rows_span(c.load_bytes, bs):    # windows over other block counts
            assert not r.ok and f"built for span {c.span}" in r.reason, r.reason
            continue
        assert r.ok, f"{c.short()} {prob.label()}: {r.reason}"
        assert len(r.checked) == 3


def test_large_k_and_the_five_target_shapes(seed):
    for n, k in ((1024, 4096), (4096, 14336), (28672, 8192)):
        for m, knobs in ((1, CONFIGS[0][1]), (16, dict(CONFIGS[7][1], astage="global")), (1, CONFIGS[13][1]),
                         (1, CONFIGS[19][1]), (1, CONFIGS[21][1]), (1, CONFIGS[25][1]), (1, CONFIGS[26][1]),
                         (16, CONFIGS[28][1]), (1, CONFIGS[29][1]), (16, CONFIGS[30][1]), (2, CONFIGS[31][1]),
                         (1, CONFIGS[32][1]), (1, CONFIGS[33][1]), (1, CONFIGS[34][1]), (2, CONFIGS[35][1]),
                         (1, CONFIGS[36][1]), (2, CONFIGS[37][1]), (1, CONFIGS[38][1]), (2, CONFIGS[39][1]),
                         (1, CONFIGS[40][1]), (2, CONFIGS[41][1]), (1, CONFIGS[42][1]), (1, CONFIGS[43][1]),
                         (8, CONFIGS[44][1]), (4, CONFIGS[46][1])):
            c = MM.config(**knobs, dtype="bf16", quant="nf4", m=m)
            r = check_config(c, P(n, k, m), seed=seed)
            assert r.ok, f"{c.short()} {n}x{k}: {r.reason}"
    # A staged in shared memory does not fit at K = 14336 with a 16-row batch tile: refused, with the reason
    c = MM.config(**CONFIGS[7][1], dtype="bf16", quant="nf4", m=16)
    r = check_config(c, P(4096, 14336, 16), seed=seed)
    assert not r.ok and "shared memory" in r.reason


@pytest.mark.parametrize("index", SPAN_CONFIGS)
def test_windows_over_several_blocks_at_their_blocksize(seed, index):
    """span 2 / 4 at the blocksize each serves, with nf4 and fp4, bf16 and fp16 (the gate's three shapes: odd
    N, a batch not filling the tile, a short K whose last window is partial), and the candidate at the large
    target shapes."""
    m, knobs = CONFIGS[index]
    bs = 8 * knobs["load_bytes"] // knobs["span"]
    for dtype in ("bf16", "fp16"):
        for quant in ("nf4", "fp4"):
            c = MM.config(**knobs, dtype=dtype, quant=quant, m=m)
            r = check_config(c, P(1000, 2048, m, dtype, quant, bs), seed=seed)
            assert r.ok and len(r.checked) == 3, f"{c.short()} bs{bs}: {r.reason}"
    if index == SPAN_CONFIGS[0]:
        for n, k in ((28672, 8192), (4096, 14336), (1024, 4096)):
            c = MM.config(**knobs, m=m)
            r = check_config(c, P(n, k, m, bs=bs), seed=seed)
            assert r.ok, f"{c.short()} {n}x{k}: {r.reason}"


def _same_output_as(seed, m, knobs, other):
    """The config ``knobs`` writes exactly what the same config with ``other``'s knobs changed writes (nf4 and
    fp4, bf16 and fp16, odd N, a K of several groups and a partial last one), leaves no NaN of the poisoned
    output, and passes the gate at 28672x8192."""
    from nf4tune.kernel.launch import bind, load_kernel

    bs = 8 * knobs["load_bytes"] // knobs.get("span", 1) if knobs.get("span", 1) > 1 else 64
    for dtype in ("bf16", "fp16"):
        for quant in ("nf4", "fp4"):
            prob = P(999, 3 * 1024 + 2 * bs, m, dtype, quant, bs)
            inputs = MM.make_inputs(prob, prob.shape, seed)
            outs, parts = [], 1
            for k in (knobs, dict(knobs, **other)):
                c = MM.config(**k, dtype=dtype, quant=quant, m=m)
                out = MM.new_output(inputs)
                launch = bind(load_kernel(c), inputs, out)
                launch()
                torch.cuda.synchronize()
                outs.append(out)
                # the fp32 parts summed into an output: K's splits, or the most CTAs a stream-K tile is cut between
                parts = max(parts, launch.plan.splits, *(launch.plan.stream_k_parts or [1]))
            c = MM.config(**knobs, dtype=dtype, quant=quant, m=m)
            assert not torch.isnan(outs[0]).any(), f"{c.short()}: NaN left in the output"
            if parts <= 2:
                # one or two fp32 parts per output: the split's atomic sum is the same whatever the order
                assert torch.equal(outs[0], outs[1]), f"{c.short()} {prob.label()}: differs with {other}"
            else:
                # more parts: the fp32 atomics add in arrival order, so two runs (of one config or two) may
                # round apart; each within the gate's bound, and apart by at most two fp32 sums' order noise
                # (gamma(K) * S each) plus one unit in the last place of the output dtype
                for out in outs:
                    assert MM.compare(out, MM.expected(inputs), inputs, c) is None
                b = outs[1].double()
                allowed = (2 * gamma(inputs.K, 2.0**-24) * MM._reference(inputs)["S"]
                           + torch.finfo(outs[1].dtype).eps * b.abs())
                worst = ((outs[0].double() - b).abs() - allowed).max().item()
                assert worst <= 0, f"{c.short()} {prob.label()}: differs with {other} beyond the sum order's noise"
    c = MM.config(**knobs, m=m)
    r = check_config(c, P(28672, 8192, m, bs=bs), seed=seed)
    assert r.ok, f"{c.short()} 28672x8192: {r.reason}"


@pytest.mark.parametrize("index", PRMTQ_CONFIGS)
def test_prmt_quarters_give_the_pair_tables_sums_bit_for_bit(seed, index):
    """The permutes decode the same 16-bit codes as the pair table and the mma order is unchanged, so a
    config with prmt_quarters writes exactly the output of the same config without."""
    m, knobs = CONFIGS[index]
    _same_output_as(seed, m, knobs, dict(prmt_quarters=0))


@pytest.mark.parametrize("index", AHEAD2_CONFIGS)
def test_two_groups_ahead_give_one_group_aheads_sums_bit_for_bit(seed, index):
    """prefetch 2 only issues the loads earlier: the same groups are computed in the same order, so the
    output is the prefetch-1 config's bit for bit (where K is split in more than two parts, up to the fp32
    atomics' arrival order: session 16's H100 saw fp16 at split-K 16 round apart)."""
    m, knobs = CONFIGS[index]
    _same_output_as(seed, m, knobs, dict(prefetch=1))


@pytest.mark.parametrize("index", REGCAP_CONFIGS)
def test_a_register_cap_gives_the_uncapped_sums_bit_for_bit(seed, index):
    """regcap only changes where ptxas keeps values (registers or local memory): the same instructions' results
    in the same order, so the output is the uncapped config's bit for bit (split-K 2: order-free)."""
    m, knobs = CONFIGS[index]
    _same_output_as(seed, m, knobs, dict(regcap=0))


@pytest.mark.parametrize("index", ACHUNK_CONFIGS)
def test_a_chunk_at_a_time_gives_the_whole_windows_sums_bit_for_bit(seed, index):
    """achunk only moves A's shared loads next to the k-steps that use them: the same mmas in the same order,
    so the output is the achunk-0 config's bit for bit (split-K 1-2: order-free)."""
    m, knobs = CONFIGS[index]
    _same_output_as(seed, m, knobs, dict(achunk=0))


@pytest.mark.parametrize("index", STREAM_K_CONFIGS)
def test_stream_k_over_any_count_of_ctas(seed, index):
    """Stream-K with the grid the plan makes on a GPU of 1, 2, 5 or 13 SMs and on this one: runs of several
    tiles, tiles cut between 2 to many CTAs, whole tiles; each output within the gate's bound of the reference
    with no NaN of the poisoned output left, twice in a row (the workspace and the counters put back to zero);
    and the candidate at 28672x8192 and 1024x4096."""
    from dataclasses import replace

    from nf4tune.kernel.arch import device_limits
    from nf4tune.kernel.launch import bind, load_kernel

    m, knobs = CONFIGS[index]
    bs = 8 * knobs["load_bytes"] // knobs["span"] if knobs.get("span", 1) > 1 else 64
    real = device_limits(0)
    for dtype, quant in (("bf16", "nf4"), ("fp16", "fp4")):
        c = MM.config(**knobs, dtype=dtype, quant=quant, m=m)
        k = load_kernel(c)
        prob = P(999, 3 * 1024 + 2 * bs, m, dtype, quant, bs)
        inputs = MM.make_inputs(prob, (999, 3 * 1024 + 2 * bs, max(1, m - 1), True), seed)
        want = MM.expected(inputs)
        grids = set()
        for sms in (1, 2, 5, 13, real.sm_count):
            plan = MM.plan_for(c, inputs, replace(real, sm_count=sms), k.compiled.registers)
            grids.add(plan.grid[0])
            for _ in range(2):
                out = MM.new_output(inputs)
                bind(k, inputs, out, plan=plan)()
                torch.cuda.synchronize()
                assert not torch.isnan(out).any(), f"{c.short()} on {sms} SMs: NaN left in the output"
                bad = MM.compare(out, want, inputs, c)
                assert not bad, f"{c.short()} on {sms} SMs (grid {plan.grid}, parts {plan.stream_k_parts}): {bad}"
        assert len(grids) >= 4, grids
    for n, kk in ((28672, 8192), (1024, 4096)):
        r = check_config(MM.config(**knobs, m=m), P(n, kk, m, bs=bs), seed=seed)
        assert r.ok, f"{n}x{kk}: {r.reason}"


def test_plain_absmax(seed):
    from dataclasses import replace

    from nf4tune.kernel.launch import bind, load_kernel

    prob = P(300, 1024, 2)
    inputs = MM.make_inputs(prob, prob.shape, seed)
    w = F.dequantize_4bit(inputs.B, inputs.qs)
    B, qs = F.quantize_4bit(w, blocksize=64, compress_statistics=False, quant_type="nf4")
    plain = replace(inputs, B=B, qs=qs, ref={})
    want = MM.expected(plain)
    for knobs in (CONFIGS[3][1], dict(CONFIGS[6][1], mtile=8), CONFIGS[9][1], CONFIGS[10][1], CONFIGS[13][1],
                  CONFIGS[14][1], CONFIGS[17][1], dict(CONFIGS[18][1], mtile=8), CONFIGS[19][1], CONFIGS[20][1],
                  CONFIGS[23][1], CONFIGS[25][1], CONFIGS[26][1], dict(CONFIGS[28][1], mtile=8), CONFIGS[29][1],
                  dict(CONFIGS[30][1], mtile=8), CONFIGS[31][1], CONFIGS[32][1], CONFIGS[33][1], CONFIGS[36][1],
                  CONFIGS[37][1], CONFIGS[40][1], CONFIGS[41][1], CONFIGS[42][1], CONFIGS[43][1], CONFIGS[44][1],
                  CONFIGS[47][1], CONFIGS[48][1], CONFIGS[49][1]):
        c = MM.config(**knobs, m=8 if knobs.get("mma") == "mma" else 2)
        out = MM.new_output(plain)
        bind(load_kernel(c), plain, out)()
        torch.cuda.synchronize()
        assert MM.compare(out, want, plain, c) is None


def test_the_scale_table_with_large_blocks_and_slices_inside_a_block(seed):
    """stats tile: split-K slices that start and end inside a block (blocksize 1024-4096 against
    slices of 512-2048 values), one block column per slice, and the plain absmax."""
    from dataclasses import replace

    for bs, ksplit, m, knobs in ((4096, 4, 1, CONFIGS[25][1]), (4096, 4, 1, CONFIGS[26][1]),
                                 (2048, 8, 8, CONFIGS[25][1]), (2048, 8, 4, CONFIGS[27][1]),
                                 (1024, 16, 16, CONFIGS[28][1]), (1024, 16, 1, CONFIGS[26][1]),
                                 (4096, 4, 1, CONFIGS[29][1]), (2048, 8, 16, CONFIGS[30][1])):
        c = MM.config(**dict(knobs, ksplit=ksplit), dtype="bf16", quant="nf4", m=m)
        r = check_config(c, P(777, 8192, m, bs=bs), seed=seed)
        assert r.ok, f"{c.short()} bs{bs}: {r.reason}"
    prob = P(333, 8192, 1, bs=4096)
    inputs = MM.make_inputs(prob, prob.shape, seed)
    w = F.dequantize_4bit(inputs.B, inputs.qs)
    B, qs = F.quantize_4bit(w, blocksize=4096, compress_statistics=False, quant_type="nf4")
    plain = replace(inputs, B=B, qs=qs, ref={})
    want = MM.expected(plain)
    from nf4tune.kernel.launch import bind, load_kernel

    for knobs in (CONFIGS[25][1], CONFIGS[26][1], CONFIGS[29][1]):
        c = MM.config(**dict(knobs, ksplit=8), m=1)
        out = MM.new_output(plain)
        bind(load_kernel(c), plain, out)()
        torch.cuda.synchronize()
        assert MM.compare(out, want, plain, c) is None, c.short()


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_float_pair_table_sums_as_the_16_entry_table_bit_for_bit(seed, dtype):
    """lut pairf looks up both exact codes of a packed byte at once; the products and their order are
    lut shared's, so without split-K (whose atomics add in any order) the outputs are equal bit for bit,
    at odd N, M not a multiple of the tile and K up to 8192."""
    from nf4tune.kernel.launch import bind, load_kernel

    for n, k, m in ((1000, 2048, 3), (4099, 8192, 1)):
        prob = P(n, k, m, dtype)
        inputs = MM.make_inputs(prob, prob.shape, seed)
        for knobs in (CONFIGS[36][1], dict(CONFIGS[37][1], ksplit=1)):
            outs = []
            for lut in ("pairf", "shared"):
                c = MM.config(**dict(knobs, lut=lut), dtype=dtype, m=4)
                out = MM.new_output(inputs)
                bind(load_kernel(c), inputs, out)()
                torch.cuda.synchronize()
                assert not out.isnan().any(), c.short()
                outs.append(out)
            assert torch.equal(outs[0], outs[1]), f"{c.short()} {n}x{k} m{m}"


def _wrong(config, old, new):
    src = config.render()
    assert old in src
    return LoadedKernel(config, source=src.replace(old, new, 1))


def test_the_gate_rejects_wrong_kernels(seed):
    prob = P(512, 1024, 1)
    c = MM.config(**CONFIGS[0][1], m=1)
    swapped = _wrong(c, "acc = fmaf(first, a[2 * j], acc);", "acc = fmaf(second, a[2 * j], acc);")
    r = check_config(c, prob, seed=seed, kernel=swapped)
    assert not r.ok and "bound" in r.reason
    c = MM.config(**CONFIGS[6][1], m=8)
    unscaled = _wrong(c, "first = __fmul_rn(first, sc);", "first = __fmul_rn(first, 1.0f);")
    r = check_config(c, P(512, 1024, 8), seed=seed, kernel=unscaled)
    assert not r.ok


def _table_with(tmp_path, entries):
    from nf4tune.serve import table

    path = tmp_path / "t.json"
    path.write_text(json.dumps(dict(format=2, entries=entries)))
    table.use_configs(str(path))


def _entry(gpu, n, k, m, config, speedup):
    return dict(gpu=gpu, family="matmul", shape=[n, k], dtype="bf16", quant="nf4", blocksize=64, m=m,
                config=config.to_dict(), median_us=1.0, speedup_vs_bnb=speedup)


def test_runtime_and_patch_serve_only_where_faster(seed, tmp_path):
    from nf4tune import serve
    from nf4tune.serve import table

    gpu = torch.cuda.get_device_name(0)
    torch.manual_seed(seed)
    layer = bnb.nn.Linear4bit(4096, 1024, bias=True, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
    fast = MM.config(**CONFIGS[0][1], m=1)
    mma = MM.config(**CONFIGS[6][1], m=8)
    try:
        _table_with(tmp_path, [_entry(gpu, 1024, 4096, 1, fast, 3.0), _entry(gpu, 1024, 4096, 8, mma, 0.9)])
        qs = layer.weight.quant_state
        for M, served in ((1, True), (7, False)):
            x = torch.randn(M, 4096, dtype=torch.bfloat16, device="cuda")
            with torch.no_grad():
                want = layer(x)
                before = serve.stats()
                got = serve.matmul_4bit(x, layer.weight.t(), qs, bias=layer.bias)
                after = serve.stats()
                assert (after["matmul_calls"] - before["matmul_calls"]) == int(served)
                assert (after["matmul_bnb"] - before["matmul_bnb"]) == int(not served)
                assert got.shape == want.shape and got.dtype == want.dtype
                # within bnb's own error of the fp64 reference
                ref = (x.double() @ F.dequantize_4bit(layer.weight, qs).double().t() + layer.bias.double())
                assert float((got.double() - ref).abs().max()) <= 1.01 * float((want.double() - ref).abs().max()) + 1e-2
                with serve.patch_bitsandbytes():
                    c0 = serve.stats()["matmul_calls"]
                    patched = layer(x)
                    assert serve.stats()["matmul_calls"] - c0 == int(served)
                assert torch.equal(patched, got) if served else torch.equal(patched, want)
            assert serve.explain_matmul(x, qs, layer.bias).served == served
        # K not a multiple of the blocksize: bnb refuses to fuse, so do we
        odd = bnb.nn.Linear4bit(4096 + 32, 64, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
        x = torch.randn(1, 4096 + 32, dtype=torch.bfloat16, device="cuda")
        with torch.no_grad():
            assert not serve.explain_matmul(x, odd.weight.quant_state).served
            assert torch.equal(serve.matmul_4bit(x, odd.weight.t(), odd.weight.quant_state), odd(x))
    finally:
        table.use_configs(None)


def test_deterministic_mode_serves_only_order_free_sums(seed, tmp_path):
    """Under torch.use_deterministic_algorithms(True) a variant that adds more than two split-K parts of an
    output with fp32 atomics is not served (bnb serves, counted, explain_matmul says why, bnb's bits); one of
    two parts (an order-free sum) still is, the same bits twice; with the mode off both are served."""
    from nf4tune import serve
    from nf4tune.serve import table

    gpu = torch.cuda.get_device_name(0)
    torch.manual_seed(seed)
    four = bnb.nn.Linear4bit(4096, 1024, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
    two = bnb.nn.Linear4bit(4096, 4096, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
    split4, split2 = MM.config(**CONFIGS[1][1], m=1), MM.config(**CONFIGS[2][1], m=1)
    assert (split4.ksplit, split2.ksplit) == (4, 2)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        _table_with(tmp_path, [_entry(gpu, 1024, 4096, 1, split4, 3.0), _entry(gpu, 4096, 4096, 1, split2, 3.0)])
        x = torch.randn(1, 4096, dtype=torch.bfloat16, device="cuda")
        with torch.no_grad():
            torch.use_deterministic_algorithms(True)
            d = serve.explain_matmul(x, four.weight.quant_state)
            assert not d.served and "deterministic" in d.reason and "4 parts" in d.reason, d
            before = serve.stats()
            got = serve.matmul_4bit(x, four.weight.t(), four.weight.quant_state)
            after = serve.stats()
            assert after["matmul_bnb"] - before["matmul_bnb"] == 1 and after["matmul_calls"] == before["matmul_calls"]
            assert torch.equal(got, four(x))                     # bnb's own result
            assert serve.explain_matmul(x, two.weight.quant_state).served
            c0 = serve.stats()["matmul_calls"]
            a = serve.matmul_4bit(x, two.weight.t(), two.weight.quant_state)
            b = serve.matmul_4bit(x, two.weight.t(), two.weight.quant_state)
            assert serve.stats()["matmul_calls"] - c0 == 2 and torch.equal(a, b)
            torch.use_deterministic_algorithms(False)
            assert serve.explain_matmul(x, four.weight.quant_state).served
            c0 = serve.stats()["matmul_calls"]
            serve.matmul_4bit(x, four.weight.t(), four.weight.quant_state)
            assert serve.stats()["matmul_calls"] - c0 == 1
    finally:
        torch.use_deterministic_algorithms(was)
        table.use_configs(None)


@pytest.mark.parametrize("index", [1, STREAM_K_CONFIGS[0]])
def test_cuda_graph_capture_and_torch_compile(seed, tmp_path, index):
    """Served under a CUDA graph and torch.compile: split-K (the workspace fix-up in a graph) and stream-K
    (tiles cut between CTAs: the workspace and the tiles' counters put back to zero for the next replay)."""
    from nf4tune import serve
    from nf4tune.serve import table

    gpu = torch.cuda.get_device_name(0)
    torch.manual_seed(seed)
    layer = bnb.nn.Linear4bit(4096, 4096, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
    split = MM.config(**CONFIGS[index][1], m=1)
    try:
        _table_with(tmp_path, [_entry(gpu, 4096, 4096, 1, split, 3.0)])
        x = torch.randn(1, 4096, dtype=torch.bfloat16, device="cuda")
        with torch.no_grad(), serve.patch_bitsandbytes():
            eager = layer(x)                                  # warm-up builds the plan
            calls = serve.stats()["matmul_calls"]
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                layer(x)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y = layer(x)
            def close(a, b):   # split-K sums with atomics: the order (and the last bit) may differ
                return bool(((a.float() - b.float()).abs() <= 2.0**-7 * b.float().abs() + 1e-3).all())

            for _ in range(2):                                # replays are live, the split-K workspace kept zero
                x.copy_(torch.randn_like(x))
                g.replay()
                torch.cuda.synchronize()
                assert close(y, layer(x))
            assert serve.stats()["matmul_calls"] > calls
            compiled = torch.compile(layer)
            assert close(compiled(x), layer(x))
        del eager
    finally:
        table.use_configs(None)
