"""mma-cols, the column tensor-core structure of the matmul family, on the CPU: its knobs and constraints, the
launch plan and its refusals, the error bound's case, NVRTC compiles of a covering sample of its sources, the
density of its steady-state loop in the SASS against today's served M = 1 configs, and an emulation of its
index algebra (every lane's runs of W, A's stage, the predicated operand loads, the m16n8k16 fragments, the
scales, the epilogue's reduction) against a direct matmul. The GPU side is tests/test_matmul_cols_gpu.py."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from nf4tune.families import MATMUL as MM
from nf4tune.families.matmul import MatmulPlan, error_bound, rounded_codes
from nf4tune.families.matmul.resources import (COLS_STAGE_BELOW, COLS_TABLE_BYTES, cols_pitch, cols_registers,
                                               cols_stage_bytes, cols_smem, cols_window)
from nf4tune.families.matmul.space import COLS_MAX_REGISTERS
from nf4tune.family import DeviceLimits
from nf4tune.vocabulary import InvalidConfig, Problem, UnsupportedInput

#: an H100 / H200: 132 SMs, 227 KiB of shared memory per block with the opt-in
HOPPER = DeviceLimits(sm_count=132, smem_per_block_optin=232448)
#: mma-cols' knobs as the structure takes them, and its M = 1 config (one 16-row tile per warp, one batch row per
#: n8 tile, parts of 64, the prefetch, the 64 KiB-aligned table, streaming loads: the knobs' defaults)
COLS = dict(mma="mma-cols", lut="pairx", astage="shared", load_bytes=16, scale="block")
M1 = dict(COLS, rows_per_warp=16, mtile=1, warps=8, prefetch=1, m=1)


def cols(**knobs):
    return MM.config(**{**M1, **knobs})


# ----------------------------------------------------------------------------- the declaration
def test_mma_cols_is_in_the_default_space_and_its_knobs_change_no_other_structure():
    """mma-cols won a served entry (H100, 4096x14336 M = 8), so it and the knob values it won with (cols_mb 4,
    table64 0) are in the default space, and its other values (cols_mb 2 and 8, parts of 32 and 128) only in the
    whole one; the default space grows by mma-cols' sources alone; every other structure takes cols_mb, part and
    table64 at their defaults, its label unchanged; the rendered source names the knobs' macros and joins only
    common.cuh and mma_cols.cu after the code table."""
    assert (MM.count().configs, MM.count().sources) == (942240, 7312)
    without = MM.count(mma=[v for v in MM.knob("mma").values if v != "mma-cols"])
    assert (without.configs, without.sources) == (935800, 7128)        # the default space before mma-cols joined
    default = {c.mma for c in MM.iter_sources(dtype=["bf16"], quant=["nf4"], m=[1])}
    assert "mma-cols" in default
    c = cols()
    assert c.experimental() == () and MM.in_space(c)
    for knob, value in (("cols_mb", 2), ("part", 32), ("part", 128)):
        other = MM.config(**{**M1, "mtile": 8, "m": 8, "cols_mb": 4, knob: value}) if knob == "part" else \
            MM.config(**{**M1, "mtile": 8, "m": 8, knob: value})
        assert other.experimental() == (knob,) and MM.in_space(other, experimental=True)
    assert MM.template_files(c) == ("codes.cuh", "matmul/common.cuh", "matmul/mma_cols.cu")
    src = c.render()
    for line in ("#define NF4T_MMA NF4T_MMA_MMA_COLS", "#define NF4T_COLS_MB 1", "#define NF4T_PART 64",
                 "#define NF4T_TABLE64 1", "#define NF4T_LUT NF4T_LUT_PAIRX"):
        assert line + "\n" in src, line
    assert "// ---- kernel_templates/matmul/mma_cols.cu\n" in src
    assert "// ---- kernel_templates/matmul/tensor.cuh" not in src
    # the knobs' other values show in the label; their defaults never do
    assert not {"mb", "P64", "t64"} & set(c.short().split())
    other = cols(mtile=8, cols_mb=4, part=32, table64=0, m=8)
    assert {"mb4", "P32", "t64:0"} <= set(other.short().split()), other.short()
    for other in [MM.config(m=1)] + [MM.builtin_default(Problem((64, 64), "bf16", "nf4", 64, "matmul", m))
                                     for m in (1, 8, 64)]:
        assert (other.cols_mb, other.part, other.table64) == (1, 64, 1)
        assert not {"mb1", "P64", "t64:1"} & set(other.short().split())
    for knob, value in (("cols_mb", 2), ("part", 32), ("table64", 0)):
        with pytest.raises(InvalidConfig, match="knobs of the column tensor-core path"):
            MM.config(m=1, **{knob: value})


@pytest.mark.parametrize("bad, match", [
    (dict(dtype="fp32"), "no tensor-core path for fp32"),
    (dict(lut="pair"), "decodes with lut pairx"),
    (dict(load_bytes=8), "load_bytes stays 16"),
    (dict(rows_per_warp=64), "16 or 32 rows per warp"),
    (dict(scale="value"), "scales once per"),
    (dict(astage="global"), "stages A in shared memory"),
    (dict(mtile=2), "leave columns empty"),
    (dict(mtile=8, cols_mb=8, m=16), "read W more than once"),
    (dict(mtile=4, cols_mb=8, m=4), "whole number of n8 tiles"),
    (dict(mtile=32, cols_mb=2, m=32), "n8 tiles exceed 8"),
    (dict(rows_per_warp=32, prefetch=1), "registers of windows"),
    (dict(part=128, prefetch=1), "registers of windows"),
    (dict(unroll=2), "knobs of the K-split"),
    (dict(persist=1), "knobs of the K-split"),
    (dict(prefetch=2), "prefetch 2"),
    (dict(span=2), "span"),
    (dict(achunk=1), "achunk"),
    (dict(regcap=80), "regcap"),
    (dict(prmt_quarters=1), "prmt_quarters"),
])
def test_the_constraints_refuse_what_mma_cols_cannot_take(bad, match):
    with pytest.raises(InvalidConfig, match=match):
        cols(**bad)


def test_the_register_rule_follows_the_windows_registers():
    """cols_registers: W (two window sets with the prefetch), the accumulators and A's chunk; the rule admits
    the M = 1 config, 32-row tiles without the prefetch, and every batch of the space with some config."""
    assert cols_registers(64, 1, 16, 1, 1) == 64 + 8 + 4 <= COLS_MAX_REGISTERS
    assert cols_registers(64, 1, 32, 0, 1) == 64 + 16 + 4
    assert cols_registers(64, 1, 32, 1, 1) > COLS_MAX_REGISTERS
    assert cols(rows_per_warp=32, prefetch=0).rows_per_warp == 32 and cols(warps=16).warps == 16
    batches = {c.m for c in MM.iter_sources(experimental=True, dtype=["bf16"], quant=["nf4"], mma=["mma-cols"])}
    assert batches == {1, 2, 4, 8, 16, 32}              # mtile = m, at most 32 batch rows per CTA
    with pytest.raises(InvalidConfig, match="the 64-row tile is mma-rows'"):
        cols(m=64, mtile=64, cols_mb=8, prefetch=0)


def test_the_error_bound_is_the_tensor_core_case_with_rounded_codes():
    """error_bound needs no case of its own: mma-cols rounds the codes to the operand dtype (its pair table)
    and accumulates in fp32 on the tensor cores, as mma-rows does: the same bound, above SIMT's exact codes."""
    import torch

    S = torch.full((1, 4), 100.0, dtype=torch.float64)
    y = torch.full((1, 4), 10.0, dtype=torch.float64)
    rows = MM.config(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=8, lut="pairx",
                     astage="shared", unroll=2, prefetch=1, span=2, m=1)
    for dtype in ("bf16", "fp16"):
        c = cols(dtype=dtype)
        assert rounded_codes(c)
        assert torch.equal(error_bound(c, 8192, S, y), error_bound(rows.replace(dtype=dtype), 8192, S, y))
    assert float(error_bound(cols(), 8192, S, y)[0, 0]) > float(error_bound(MM.config(m=1), 8192, S, y)[0, 0])


# ----------------------------------------------------------------------------- the launch plan
def test_the_plan_geometry_shared_memory_and_split_k():
    c = cols()
    p = MatmulPlan(c, 1, 8192, 8192, 64, 256, HOPPER, registers=134, device="cpu")
    assert p.grid == (8192 // (8 * 16), 1, 1) and p.block == 256 and p.kper == 8192 and p.ws is None
    stage = cols_stage_bytes(8192, 64, 1, 1)
    assert stage == cols_pitch(8192, 64, 1) == 128 * 272 + 16 <= COLS_STAGE_BELOW
    assert p.smem == 2 * COLS_TABLE_BYTES == cols_smem(stage, 1)          # the stage fits below the table
    # K per split: whole windows (8 parts of 64); split-K takes the family's workspace and counters
    s = MatmulPlan(c.replace(ksplit=4), 1, 4096, 14336, 64, 256, HOPPER, registers=134, device="cpu")
    assert cols_window(64, 1) == 512 and s.kper == 3584 and s.kper % 512 == 0 and s.splits == 4
    assert s.grid == (32, 4, 1) and s.ws.numel() == 4096 and s.counters.numel() == 32 and not s.order_free
    assert MatmulPlan(c.replace(ksplit=2), 1, 4096, 14336, 64, 256, HOPPER, device="cpu").order_free
    # a stage too big for the space below the table goes above it; without table64 the table comes first
    big = MatmulPlan(c, 1, 4096, 14336, 64, 256, HOPPER, device="cpu")
    stage = cols_stage_bytes(14336, 64, 1, 1)
    assert stage > COLS_STAGE_BELOW and big.smem == 2 * COLS_TABLE_BYTES + stage
    flat = MatmulPlan(c.replace(table64=0), 1, 4096, 14336, 64, 256, HOPPER, device="cpu")
    assert flat.smem == COLS_TABLE_BYTES + stage
    # batch tiles: mtile rows per CTA; a call with fewer rows stages only those
    b = cols(mtile=8, cols_mb=4, m=8, ksplit=2)
    p8 = MatmulPlan(b, 5, 1000, 4096, 64, 256, HOPPER, device="cpu")
    assert cols_window(64, 4) == 128 and p8.kper == 2048 and p8.grid == (-(-1000 // 128), 2, 1)
    assert p8.smem == cols_smem(cols_stage_bytes(2048, 64, 4, 5), 1)
    assert MatmulPlan(b.replace(ksplit=1), 13, 1000, 4096, 64, 256, HOPPER, device="cpu").grid[2] == 2


def test_the_plan_refuses_with_reasons():
    c = cols()
    with pytest.raises(UnsupportedInput, match="blocksize 128 is not the variant's part 64.*part 128 serves it"):
        MatmulPlan(c, 1, 1024, 4096, 128, 256, HOPPER, device="cpu")
    with pytest.raises(UnsupportedInput, match="blocksize 256 .* no part serves it"):
        MatmulPlan(c, 1, 1024, 4096, 256, 256, HOPPER, device="cpu")
    with pytest.raises(UnsupportedInput, match="shared memory"):              # A of K = 28672 beside the table
        MatmulPlan(c, 1, 4096, 28672, 64, 256, HOPPER, device="cpu")
    assert MatmulPlan(c.replace(ksplit=2), 1, 4096, 28672, 64, 256, HOPPER, device="cpu").splits == 2
    with pytest.raises(UnsupportedInput, match="shared memory"):              # 48 KiB without the opt-in
        MatmulPlan(c, 1, 1024, 4096, 64, 256, DeviceLimits(sm_count=132), device="cpu")
    with pytest.raises(UnsupportedInput, match="registers"):
        MatmulPlan(c.replace(warps=16), 1, 1024, 4096, 64, 256, HOPPER, registers=244, device="cpu")
    # fp32 activations: no mma-cols variant computes in fp32 (the space refuses it), and a call with them is refused
    import torch
    from types import SimpleNamespace

    qs = SimpleNamespace(shape=(1024, 4096), blocksize=64, quant_type="nf4", state2=None)
    fp32 = SimpleNamespace(A=torch.zeros(1, 4096, dtype=torch.float32), qs=qs, bias=None)
    with pytest.raises(UnsupportedInput, match="A is fp32, this variant computes in bf16"):
        MM.plan_for(c, fp32, HOPPER, None)
    # cols_mb 1 loads two absmax bytes at once: their pointer must be even (checked per call)
    p = MatmulPlan(c, 1, 1024, 4096, 64, 256, HOPPER, device="cpu")
    p.check_stats((4096, 256, 512, 0, 1024))
    with pytest.raises(UnsupportedInput, match="2-byte aligned"):
        p.check_stats((4097, 256, 512, 0, 1024))
    MatmulPlan(cols(mtile=8, cols_mb=2, m=8), 1, 1024, 4096, 64, 256, HOPPER, device="cpu").check_stats(
        (4097, 256, 512, 0, 1024))


# ----------------------------------------------------------------------------- NVRTC and the SASS
def _heaviest_sources() -> list:
    """Per (batch tile, cols_mb), the bf16/nf4 source with the most windows' registers (the ones to spill first)."""
    best = {}
    for c in MM.iter_sources(experimental=True, dtype=["bf16"], quant=["nf4"], mma=["mma-cols"]):
        regs = cols_registers(c.part, c.cols_mb, c.rows_per_warp, c.prefetch, c.mtile)
        key = (c.mtile, c.cols_mb)
        if key not in best or regs > best[key][0]:
            best[key] = (regs, c)
    return [c for _, c in best.values()]


def test_a_covering_sample_of_mma_cols_compiles_without_spills(compile_cache):
    """Every two source-knob values of mma-cols together (all dtypes and quants it takes), and the heaviest
    source of each batch tile: NVRTC compiles them for sm_90 without spills, and a CTA of 8 warps launches."""
    import os

    from nf4tune.kernel.compiler import compile_config, compile_many

    sources = list(MM.iter_sources(experimental=True, mma=["mma-cols"]))
    assert {c.dtype for c in sources} == {"bf16", "fp16"} and {c.quant for c in sources} == {"nf4", "fp4"}
    sample = list(dict.fromkeys(MM.covering_sources(sources, 2) + _heaviest_sources()))
    summary = compile_many(sample, "sm_90", workers=os.cpu_count(), cache_dir=compile_cache)
    assert summary.failures == [], summary.failures[:2]
    assert summary.sources == len(sample) and summary.spilling == 0, summary.spilling
    for c in sample:
        k = compile_config(c, "sm_90", cache_dir=compile_cache)
        assert HOPPER.registers_refusal(k.registers, 8 * 32) is None, (c.short(), k.registers)


def disassemble_config(c, cache):
    from nf4tune.kernel.compiler import compile_config
    from nf4tune.kernel.sass import disassemble

    return disassemble(compile_config(c, "sm_90", cache_dir=cache).cubin)


def _served_m1_h100() -> list:
    from nf4tune.serve import table

    entries = json.loads(Path(table.__file__).with_name("tuned_configs.json").read_text())["entries"]
    return list(dict.fromkeys(MM.from_dict(e["config"]) for e in entries
                              if e["family"] == "matmul" and e["m"] == 1 and "H100" in e["gpu"]))


def test_the_m1_loop_retires_more_w_per_instruction_than_every_served_m1_config(compile_cache):
    """Issue 41's count, on the CPU (sm_90): the steady-state loop of mma-cols' M = 1 config retires at least 9
    bytes of W per warp-instruction, and more than the loop of every config the packaged table serves at M = 1
    on the H100. Its loop, per trip (two windows, the prefetch): 256 bytes of W a lane in 16-byte loads (what
    the structure declares: 2 windows x 2 rows x 64 bytes), one pair lookup (PRMT + LDS) per packed byte, 64
    mmas, no bounds-checked load."""
    from nf4tune.kernel.sass import find_nvdisasm, path_instructions, w_bytes_per_instruction

    try:
        find_nvdisasm()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    mine = w_bytes_per_instruction(cols(), "sm_90", cache_dir=compile_cache)
    assert mine.nested and mine.bytes_per_instruction >= 9.0, mine.to_dict()
    assert mine.w_bytes == (1 + 1) * 1 * 2 * 64 and mine.w_loads == mine.w_bytes // 16
    mix = dict(mine.loop.mix)
    assert mix["HMMA"] == 64 and mix["LDS"] >= mine.w_bytes and mix["PRMT"] >= mine.w_bytes, mix
    served = _served_m1_h100()
    assert served and {c.mma for c in served} >= {"mma-rows"}
    for c in served:
        theirs = w_bytes_per_instruction(c, "sm_90", cache_dir=compile_cache)
        assert mine.bytes_per_instruction > theirs.bytes_per_instruction, (c.short(), theirs.to_dict())
        if c.mma == "mma-rows":       # their loop: a group of unroll windows, 2 rows of each 16-row tile per lane
            assert theirs.w_bytes == c.unroll * (c.rows_per_warp // 16) * 2 * c.load_bytes
    # with the 64 KiB-aligned table a lookup's address is its PRMT's result: every table LDS reads [R] alone
    body = path_instructions(disassemble_config(cols(), compile_cache), mine.loop)
    lookups = [t for t in body if t.split()[0] == "LDS"]
    assert len(lookups) >= mine.w_bytes and all(t.rstrip(" ;").endswith("]") and "+" not in t.split("[")[1]
                                                for t in lookups), [t for t in lookups if "+" in t][:3]


# ----------------------------------------------------------------------------- the index algebra, emulated
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0])


def _problem(N, K, M, bs, rng, nested=True):
    """bnb's layout with random bytes and statistics (the code2 values arbitrary: the algebra, not the rounding)."""
    B = rng.integers(0, 256, N * K // 2, dtype=np.uint8)
    nb = N * K // bs
    if nested:
        stats = dict(absmax_q=rng.integers(0, 256, nb, dtype=np.uint8), code2=rng.normal(size=256),
                     absmax2=rng.uniform(0.5, 2.0, -(-nb // 256)), offset=0.3, absmax_f=None)
        scale = stats["code2"][stats["absmax_q"]] * stats["absmax2"][np.arange(nb) >> 8] + stats["offset"]
    else:
        stats = dict(absmax_q=None, code2=None, absmax2=None, offset=0.0, absmax_f=rng.uniform(0.1, 2.0, nb))
        scale = stats["absmax_f"]
    vals = np.empty(N * K)
    vals[0::2], vals[1::2] = NF4[B >> 4], NF4[B & 15]
    W = (vals * np.repeat(scale, bs)).reshape(N, K)
    return B, stats, W, rng.normal(size=(M, K)), rng.normal(size=N)


def _emulate(c, B, stats, A, bias, N, K, M, bs, warps):
    """mma_cols.cu's kernel for config ``c``, lane by lane in float64, with the plan's grid and K slices: the
    lanes' runs of W (cursor and checked paths), A's stage at cols_a_slot / cols_pitch, the predicated 16-byte
    operand loads, the m16n8k16 fragments, the (row, part) scales and the quad's reduction."""
    MB, NT, RT, PART = c.cols_mb, c.mtile // c.cols_mb, c.rows_per_warp // 16, c.part
    NP, WIN, STEPS, WB = 8 // MB, cols_window(PART, MB), PART // (2 * MB), PART // MB
    NRUN = 2 if MB == 1 else 1
    RUNB, SCS, PSTR = WB // NRUN, 2 if MB == 1 else 1, (4 if MB == 1 else 2) * PART + 16
    log2_bs, log2_g = bs.bit_length() - 1, 8
    plan = MatmulPlan(c.replace(warps=warps), M, N, K, bs, 256, HOPPER, device="cpu")
    kper, splits = plan.kper, plan.splits
    rows_cta = warps * RT * 16
    assert plan.grid == (-(-N // rows_cta), splits, -(-M // c.mtile))
    out, ws, counts = np.full((M, N), np.nan), np.zeros((M, N)), {}

    def scale_of(b):
        if stats["absmax_f"] is not None:
            return stats["absmax_f"][b]
        return stats["code2"][stats["absmax_q"][b]] * stats["absmax2"][b >> log2_g] + stats["offset"]

    def a_slot(kk):
        return (kk // PART) * PSTR + (kk % PART) * (4 if MB == 1 else 2)

    lanes = [(lane >> 2, lane & 3) for lane in range(32)]
    for bz, by, bx in itertools.product(range(plan.grid[2]), range(splits), range(plan.grid[0])):
        k_begin, m0 = by * kper, bz * c.mtile
        k_end, mrows = min(K, k_begin + kper), min(c.mtile, M - m0)
        pitch = cols_pitch(kper, PART, MB)
        stage = {}                 # byte address -> the (low, high) values of a 4-byte word
        if k_begin < k_end:
            ln = k_end - k_begin
            for m in range(mrows):
                for kk in range(0, -(-ln // WIN) * WIN, 8):
                    v = [A[m0 + m, k_begin + kk + i] if kk < ln else 0.0 for i in range(8)]
                    words, zero = [(v[2 * i], v[2 * i + 1]) for i in range(4)], (0.0, 0.0)
                    if MB == 1:
                        seq = ([x for w in words for x in (w, zero)] if (kk // PART) % 8 < 4
                               else [x for w in words for x in (zero, w)])
                    else:
                        seq = words
                    dst = m * pitch + a_slot(kk)
                    for i, w in enumerate(seq):
                        assert dst + 4 * i not in stage
                        stage[dst + 4 * i] = w
        assert len(stage) * 4 <= mrows * pitch
        info = {}
        for lane, (g, t) in enumerate(lanes):
            if MB == 1:
                info[lane] = (t * (PART // 2), 2 * t, [g in (t, t + 4) and nt < mrows for nt in range(NT)],
                              g * PSTR, pitch)
            else:
                info[lane] = ((t % NP) * (PART // 2) + (t // NP) * WB, (2 * t) // MB,
                              [g // MB == t % NP and nt * MB + g % MB < mrows for nt in range(NT)],
                              (g % MB) * pitch + (t % NP) * PSTR + (t // NP) * (4 * PART // MB), MB * pitch)
        for warp in range(warps):
            row_first = bx * rows_cta
            row0 = row_first + warp * RT * 16
            acc = {(lane, rt, nt): [0.0] * 4 for lane in range(32) for rt in range(RT) for nt in range(NT)}
            if row0 < N and k_begin < k_end:
                k_whole = k_begin + (k_end - k_begin) // WIN * WIN
                fast = (k_whole > k_begin and row0 + RT * 16 <= N and stats["absmax_f"] is None and bs == PART
                        and (MB != 1 or K % (2 * PART) == 0))
                segs = [(True, k_begin, k_whole), (False, k_whole, k_end)] if fast else [(False, k_begin, k_end)]
                for kfast, ka, kb in segs:
                    adv0 = (ka - k_begin) // WIN * (NP * PSTR)
                    for kw in range(ka, kb, WIN):
                        widx = (kw - ka) // WIN
                        wbytes, sc = {}, {}
                        for lane, (g, t) in enumerate(lanes):
                            run_off, part0 = info[lane][:2]
                            for rt, h in itertools.product(range(RT), range(2)):
                                n = row0 + rt * 16 + g + 8 * h
                                got = []
                                for r in range(NRUN):
                                    k = kw + 2 * (run_off + r * 2 * PART)
                                    assert not kfast or (n < N and k < kb)
                                    inside = n < N and k < kb
                                    got += [B[(n * K) // 2 + k // 2 + i] if inside else None for i in range(RUNB)]
                                wbytes[lane, rt, h] = got
                                if kfast:          # the cursor: one 16-bit load of two even-aligned blocks at MB 1
                                    b = (n * K + kw + part0 * PART) >> log2_bs
                                    if MB == 1:
                                        assert b % 2 == 0 and b >> log2_g == (b + 1) >> log2_g
                                    sc[lane, rt, h] = [scale_of(b + j) for j in range(SCS)]
                                else:
                                    ks = [kw + (part0 + j) * PART for j in range(SCS)]
                                    sc[lane, rt, h] = [scale_of((n * K + k) >> log2_bs) if n < N and k < kb else
                                                       (0.0 if stats["absmax_f"] is not None else stats["offset"])
                                                       for k in ks]
                        d = {key: [0.0] * 4 for key in acc}
                        av = {(lane, nt): [(0.0, 0.0)] * 4 for lane in range(32) for nt in range(NT)}
                        for ch in range(STEPS // 2):
                            for lane in range(32):
                                _, _, inn, a_lane, nt_stride = info[lane]
                                for nt in range(NT):
                                    if inn[nt]:
                                        addr = a_lane + adv0 + widx * NP * PSTR + nt * nt_stride + 16 * ch
                                        assert addr % 16 == 0
                                        av[lane, nt] = [stage[addr + 4 * i] for i in range(4)]
                            for jj in range(2):
                                st = ch * 2 + jj
                                for rt in range(RT):
                                    Am = np.zeros((16, 16))
                                    for lane, (g, t) in enumerate(lanes):
                                        def dec(i, h):
                                            byte = wbytes[lane, rt, h][i]
                                            return (0.0, 0.0) if byte is None else (NF4[byte >> 4], NF4[byte & 15])
                                        i0, i1 = (st, RUNB + st) if MB == 1 else (2 * st, 2 * st + 1)
                                        for h in range(2):
                                            Am[g + 8 * h, 2 * t:2 * t + 2] = dec(i0, h)
                                            Am[g + 8 * h, 2 * t + 8:2 * t + 10] = dec(i1, h)
                                    for nt in range(NT):
                                        Bm = np.zeros((16, 8))
                                        for lane, (g, t) in enumerate(lanes):
                                            Bm[2 * t:2 * t + 2, g] = av[lane, nt][2 * jj]
                                            Bm[2 * t + 8:2 * t + 10, g] = av[lane, nt][2 * jj + 1]
                                        D = Am @ Bm
                                        for lane, (g, t) in enumerate(lanes):
                                            dd = d[lane, rt, nt]
                                            dd[0] += D[g, 2 * t]
                                            dd[1] += D[g, 2 * t + 1]
                                            dd[2] += D[g + 8, 2 * t]
                                            dd[3] += D[g + 8, 2 * t + 1]
                        for (lane, rt, nt), dd in d.items():
                            for i in range(4):
                                acc[lane, rt, nt][i] += sc[lane, rt, i >> 1][(i & 1) if MB == 1 else 0] * dd[i]
            for rt, nt in itertools.product(range(RT), range(NT)):
                v = {lane: list(acc[lane, rt, nt]) for lane in range(32)}
                if MB == 1:
                    for lane in range(32):
                        v[lane][0] += v[lane][1]
                        v[lane][2] += v[lane][3]
                    for x in (1, 2):
                        v = {lane: [v[lane][0] + v[lane ^ x][0], 0.0, v[lane][2] + v[lane ^ x][2], 0.0]
                             for lane in range(32)}
                for x in {2: (1, 2), 4: (2,)}.get(MB, ()):
                    v = {lane: [v[lane][i] + v[lane ^ x][i] for i in range(4)] for lane in range(32)}
                for lane, (g, t) in enumerate(lanes):
                    writer, mb0, mb1 = {1: (t == 0, 0, 0), 2: (t == 0, 0, 1), 4: (t < 2, 2 * t, 2 * t + 1)}.get(
                        MB, (True, 2 * t, 2 * t + 1))
                    if not (writer and row0 < N):
                        continue
                    for i in range(4):
                        n, ml = row0 + rt * 16 + g + (8 if i >= 2 else 0), nt * MB + (mb1 if i & 1 else mb0)
                        if (MB == 1 and i & 1) or not (n < N and ml < mrows):
                            continue
                        if splits > 1:
                            ws[m0 + ml, n] += v[lane][i]
                            counts[m0 + ml, n] = counts.get((m0 + ml, n), 0) + 1
                        else:
                            assert np.isnan(out[m0 + ml, n])
                            out[m0 + ml, n] = v[lane][i] + bias[n]
    for (m, n), k in counts.items():
        assert k == splits
        out[m, n] = ws[m, n] + bias[n]
    return out


#: (knobs, (N, K, M, ksplit, nested)): each n8 layout (MB 1, 2, 4, 8; 1-2 n8 tiles; 16 and 32 rows; parts of 32, 64,
#: 128), full and partial row tiles, a partial last window, K not a multiple of 2 parts (MB 1's checked path),
#: split-K, M not filling the tile, plain statistics
EMULATED = [
    (dict(mtile=1, cols_mb=1, m=1), (64, 1024, 1, 1, True)),
    (dict(mtile=1, cols_mb=1, m=1), (37, 3 * 64, 1, 1, True)),
    (dict(mtile=1, cols_mb=1, m=1, part=32), (48, 2048, 1, 2, True)),
    (dict(mtile=1, cols_mb=1, m=1, rows_per_warp=32, prefetch=0), (64, 1024, 1, 1, False)),
    (dict(mtile=2, cols_mb=1, m=2), (40, 1536, 2, 1, True)),
    (dict(mtile=4, cols_mb=2, m=4), (48, 2048, 3, 2, True)),
    (dict(mtile=8, cols_mb=4, m=8), (37, 3 * 64, 5, 1, True)),
    (dict(mtile=8, cols_mb=8, m=8, part=128), (32, 1024, 8, 1, True)),
    (dict(mtile=16, cols_mb=8, m=16, part=32), (40, 1024, 11, 2, False)),
]


@pytest.mark.parametrize("knobs, shape", EMULATED, ids=[f"mb{k['cols_mb']}-m{k['mtile']}-{s[0]}x{s[1]}"
                                                            for k, s in EMULATED])
def test_the_index_algebra_emulated_equals_a_direct_matmul(knobs, shape):
    N, K, M, ksplit, nested = shape
    c = cols(**knobs, ksplit=ksplit)
    rng = np.random.default_rng(N * K + M)
    B, stats, W, A, bias = _problem(N, K, M, c.part, rng, nested)
    got = _emulate(c, B, stats, A, bias, N, K, M, c.part, warps=2)
    want = A @ W.T + bias
    assert not np.isnan(got).any()
    assert np.abs(got - want).max() <= 1e-9 * max(1.0, np.abs(want).max())
