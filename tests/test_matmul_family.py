"""The matmul family on the CPU: its space and derivations, bnb's input checks, the launch
plan's geometry, the derived error bound, the serving decision, and NVRTC compiles."""

import itertools
import random

import pytest

torch = pytest.importorskip("torch")
import bitsandbytes.functional as F

from nf4tune.families import MATMUL as MM
from nf4tune.families.matmul import MatmulPlan, check_matmul_inputs, error_bound, gamma
from nf4tune.family import DeviceLimits
from nf4tune.vocabulary import M_BUCKETS, InvalidConfig, Problem, UnsupportedInput

LIMITS = DeviceLimits(sm_count=132)


def _launches(k, warps):
    """A CTA of ``warps`` warps at the compiled kernel's registers launches on an SM of 65,536 registers
    (sm_90; each register sub-partition holds its warps), and nothing spills."""
    return LIMITS.registers_refusal(k.registers, warps * 32) is None and not k.spill_stores


def P(n=4096, k=4096, m=1, dtype="bf16", quant="nf4", bs=64):
    return Problem((n, k), dtype, quant, bs, "matmul", m)


@pytest.mark.parametrize("m", [1, 8])
def test_space_count_parametrisation_and_neighbours(m):
    prob = P(m=m)
    restrict = dict(dtype=["bf16"], quant=["nf4"], m=[m])
    configs = set(MM.iter_space(**restrict))
    assert len(configs) == MM.space_size(**restrict) > 1000
    space = MM.search_space(prob)
    sampled = {MM.config_from_params(dict(zip(space, combo)), prob) for combo in itertools.product(*space.values())}
    assert sampled == configs
    for c in random.Random(m).sample(sorted(configs, key=lambda c: c.to_json()), 20):
        for n in MM.neighbours(c):
            assert n in configs and n != c
    assert all(c.m == m for c in configs)


def test_paths_and_constraints():
    every = dict(dtype=["bf16"], quant=["nf4"], m=[8])
    assert {c.mma for c in MM.iter_space(experimental=True, **every)} == {"simt", "mma", "mma-ks", "mma-rows", "mma-cols"}
    assert {c.mma for c in MM.iter_space(**every)} == {"simt", "mma-ks", "mma-rows", "mma-cols"}  # mma: experimental
    assert {c.mma for c in MM.iter_space(dtype=["fp32"], quant=["nf4"], m=[8])} == {"simt"}   # no fp32 MMA
    with pytest.raises(InvalidConfig, match="scales every value"):
        MM.config(mma="mma", rows_per_warp=16, mtile=8, scale="block", m=8)
    with pytest.raises(InvalidConfig, match="exceeds the batch bucket"):
        MM.config(mtile=2, load_bytes=8, m=1)
    with pytest.raises(InvalidConfig, match="registers of A"):
        MM.config(mtile=4, load_bytes=16, m=4)
    # the K-split tensor-core path: its own knobs, and only there
    ks = dict(mma="mma-ks", rows_per_warp=16, mtile=8, scale="block", m=1)
    assert MM.config(**ks, unroll=4, persist=1).unroll == 4
    with pytest.raises(InvalidConfig, match="knobs of the K-split"):
        MM.config(unroll=2, m=1)
    with pytest.raises(InvalidConfig, match="knobs of the K-split"):
        MM.config(mma="mma", rows_per_warp=16, mtile=8, scale="value", persist=1, m=8)
    with pytest.raises(InvalidConfig, match="once per window"):
        MM.config(**dict(ks, scale="value"))
    with pytest.raises(InvalidConfig, match="no shared staging"):
        MM.config(**ks, astage="shared")
    with pytest.raises(InvalidConfig, match="registers of loads in flight"):
        MM.config(**dict(ks, rows_per_warp=32, mtile=16, m=16), load_bytes=16, unroll=2, prefetch=1)
    with pytest.raises(InvalidConfig, match="reduction buffer"):
        MM.config(**dict(ks, rows_per_warp=32, mtile=16, m=16), warps=8, load_bytes=4)
    # the shared-memory ring: K-split only, replaces the register prefetch, groups of 1 or 2 windows
    assert MM.config(**ks, stages=4, load_bytes=16, unroll=2).stages == 4
    with pytest.raises(InvalidConfig, match="knobs of the K-split"):
        MM.config(stages=4, m=1)
    with pytest.raises(InvalidConfig, match="replaces the register prefetch"):
        MM.config(**ks, stages=4, prefetch=1)
    with pytest.raises(InvalidConfig, match="groups of 1 or 2 windows"):
        MM.config(**ks, stages=4, unroll=4)


def test_ring_registers_and_shared_memory():
    from nf4tune.families.matmul import ks_registers, ring_bytes

    # registers: W and the statistics are in the ring; A for two groups
    assert ks_registers(16, 16, 8, 1, 0, stages=4) == 2 * 16
    assert ks_registers(16, 16, 8, 1, 0) == 2 * 4 + 4 + 16        # W in registers: W, stats, A
    # shared memory per warp: stages x windows per group x row tiles x 2 row halves x 32 lanes x
    # (load bytes of W + 8 bytes of statistics)
    assert ring_bytes(16, 16, 1, 4, 8) == 8 * 4 * 1 * 1 * 2 * 32 * (16 + 8) == 48 * 1024
    ring = MM.config(mma="mma-ks", load_bytes=16, rows_per_warp=16, mtile=8, warps=8, scale="block", lut="pair",
                     stages=4, m=1)
    h200 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    p = MatmulPlan(ring, 1, 4096, 4096, 64, 256, h200, device="cpu")
    assert p.smem == 8 * 8 * 16 * 4 + 48 * 1024          # partial sums, then the ring (opt-in above 48 KiB)
    with pytest.raises(UnsupportedInput, match="exceed the device's"):
        MatmulPlan(ring, 1, 4096, 4096, 64, 256, LIMITS, device="cpu")    # a device without the opt-in


def test_bulk_feed_constraints_registers_and_shared_memory():
    from nf4tune.families.matmul import bulk_ring_bytes, bulk_row_bytes, bulk_stage_bytes, ks_registers

    ks = dict(mma="mma-ks", rows_per_warp=32, mtile=8, scale="block", load_bytes=8, warps=8, unroll=2, m=1)
    assert MM.config(**ks, stages=4, feed="bulk").feed == "bulk"
    assert MM.config(**ks, stages=2, feed="bulk").stages == 2
    with pytest.raises(InvalidConfig, match="it needs stages"):
        MM.config(**ks, feed="bulk")
    with pytest.raises(InvalidConfig, match="takes 4 stages"):
        MM.config(**ks, stages=2)
    with pytest.raises(InvalidConfig, match="knobs of the K-split"):
        MM.config(feed="bulk", m=1)
    # registers: one group read back from shared memory (W, the raw statistics, A), nothing ahead
    assert ks_registers(8, 32, 8, 2, 0, stages=4, feed="bulk") == 2 * (2 * 2 * 2 + 2 * 4 + 8)
    # a chunk: 8 warps x 2 windows x 64 values = 1024; W rows of 512 bytes (a multiple of 128) + 4 x 8
    assert bulk_row_bytes(8, 8, 2) == 512 + 32
    assert bulk_row_bytes(4, 1, 1) == 128 + 16                     # 16 bytes rounded up to 128
    # a stage: 32 W rows, each with 128 bytes of statistics (a float per 32 values), and one batch row
    # of A (2048 bytes + 16); the ring adds a zero row of A (2048 bytes)
    assert bulk_stage_bytes(8, 32, 2, 8, 1) == (32 * (544 + 128) + 2064, 2048)
    assert bulk_ring_bytes(8, 32, 2, 4, 8, 1) == 4 * (32 * 672 + 2064) + 2048
    # the W rows of one shared-memory load phase (32 lanes x load bytes / 128: 8, 4 or 2 rows, each
    # 4 x load bytes wide) start in distinct 4 x load-byte slices of the 128 banks' bytes
    for load in (4, 8, 16):
        rows_per_phase = 128 // (4 * load)
        for warps, unroll in itertools.product((1, 2, 4, 8), (1, 2)):
            rb = bulk_row_bytes(load, warps, unroll)
            assert rb % 16 == 0                                      # cp.async.bulk destinations
            assert sum(bulk_stage_bytes(load, 16, unroll, warps, 8)) % 16 == 0
            starts = {(r * rb) % 128 // (4 * load) for r in range(rows_per_phase)}
            assert len(starts) == rows_per_phase, (load, warps, unroll)
    # the plan: one more warp (the producer), the ring after the partial sums, A rows for the batch
    c = MM.config(**ks, stages=4, feed="bulk", lut="pair")
    h200 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    p = MatmulPlan(c, 1, 8192, 8192, 64, 256, h200, device="cpu")
    assert p.block == 32 * 9
    assert p.smem == 8 * 8 * 32 * 4 + bulk_ring_bytes(8, 32, 2, 4, 8, 1)
    assert MatmulPlan(c, 5, 8192, 8192, 64, 256, h200, device="cpu").smem == 8 * 8 * 32 * 4 + bulk_ring_bytes(
        8, 32, 2, 4, 8, 5)
    assert p.ring                              # statistics copied in 4-byte words: aligned pointers
    with pytest.raises(UnsupportedInput, match="exceed the device's"):
        MatmulPlan(c, 1, 8192, 8192, 64, 256, LIMITS, device="cpu")
    with pytest.raises(UnsupportedInput, match="more than two groups"):
        MatmulPlan(c, 1, 8192, 8192, 64, 16, h200, device="cpu")     # groups of 16 blocks: 512 values


def test_bulk_feed_compiles_for_hopper_and_says_why_not_for_ampere(compile_cache):
    from nf4tune.kernel.compiler import CompileError, compile_config

    c = MM.config(mma="mma-ks", rows_per_warp=32, mtile=8, scale="block", load_bytes=8, warps=8, unroll=2,
                  lut="pair", stages=4, feed="bulk", m=1)
    assert compile_config(c, "sm_90", cache_dir=compile_cache).registers
    with pytest.raises(CompileError, match="needs sm_90 or newer"):
        compile_config(c, "sm_80", cache_dir=compile_cache)


@pytest.mark.parametrize("m", M_BUCKETS)
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_builtin_defaults_and_presets_are_points_of_the_space(m, dtype):
    prob = P(m=m, dtype=dtype)
    c = MM.builtin_default(prob)
    assert c.m == m and c.dtype == dtype
    assert c in set(MM.iter_space(dtype=[dtype], quant=["nf4"], m=[m]))
    assert MM.preset("bnb-like", prob).rows_per_warp == 1


def test_distinct_sources_do_not_depend_on_the_batch_bucket():
    a = MM.builtin_default(P(m=1))
    b = a.replace(m=2)
    assert a.render() == b.render() and "NF4T_MBUCKET" not in a.render()


def test_problem_checks():
    MM.check_problem(P())
    with pytest.raises(ValueError, match="not a multiple of the blocksize"):
        MM.check_problem(P(k=4100))
    with pytest.raises(ValueError, match="m must be one of"):
        MM.check_problem(Problem((64, 64), family="matmul", m=3))


def _quantized(n, k, bs=64, dtype=torch.bfloat16):
    w = torch.randn(n, k, dtype=torch.float32).to(dtype)
    return F.quantize_4bit(w, blocksize=bs, compress_statistics=True, quant_type="nf4")


def test_input_checks_are_bnbs_kinds():
    B, qs = _quantized(96, 256)
    A = torch.randn(3, 256, dtype=torch.bfloat16)
    assert check_matmul_inputs(A, qs) == (96, 256, "bf16")
    with pytest.raises(RuntimeError, match="inner dim"):
        check_matmul_inputs(torch.randn(3, 128, dtype=torch.bfloat16), qs)
    with pytest.raises(RuntimeError, match="bias dtype"):
        check_matmul_inputs(A, qs, torch.randn(96))
    with pytest.raises(ValueError, match="quant_state is required"):
        check_matmul_inputs(A, None)
    B2, qs2 = _quantized(8, 96, bs=64)                # K = 96: not a multiple of 64, bnb does not fuse
    with pytest.raises(UnsupportedInput, match="not a multiple of blocksize"):
        check_matmul_inputs(torch.randn(1, 96, dtype=torch.bfloat16), qs2)


def test_plan_geometry_and_refusals():
    c = MM.config(load_bytes=16, rows_per_warp=4, mtile=1, warps=4, ksplit=4, m=1)
    plan = MatmulPlan(c, 1, 4096, 14336, 64, 256, LIMITS, registers=72, device="cpu")
    assert plan.kper % 1024 == 0 and plan.splits * plan.kper >= 14336 and (plan.splits - 1) * plan.kper < 14336
    assert plan.grid == (4096 // 16, plan.splits, 1) and plan.block == 128
    assert plan.ws.numel() == 4096 and plan.counters.numel() == 256 and plan.parts == plan.splits == 4
    one = MatmulPlan(c.replace(ksplit=1), 3, 1000, 4096, 64, 256, LIMITS, device="cpu")
    assert one.ws is None and one.grid == (-(-1000 // 16), 1, 3) and one.parts == 1
    with pytest.raises(UnsupportedInput, match="registers"):      # an sm_86-like SM file of 32K registers
        MatmulPlan(c.replace(warps=8), 1, 64, 4096, 64, 256, DeviceLimits(84, regs_per_sm=32768), registers=168,
                   device="cpu")
    staged = c.replace(astage="shared", ksplit=1)
    with pytest.raises(UnsupportedInput, match="shared memory"):
        MatmulPlan(staged, 1, 64, 28672, 64, 256, LIMITS, device="cpu")   # 56 KiB of A
    with pytest.raises(UnsupportedInput, match="blocksize"):
        MatmulPlan(c, 1, 64, 4096 + 32, 64, 256, LIMITS, device="cpu")
    mma = MM.config(mma="mma", rows_per_warp=32, mtile=16, warps=4, ksplit=2, scale="value", m=16)
    p = MatmulPlan(mma, 20, 4096, 4096, 64, 256, LIMITS, device="cpu")
    assert p.kper % 128 == 0 and p.grid == (32, 2, 2)
    # K-split tensor cores: a CTA per 16-row tile, its warps' partial sums in shared memory;
    # persistent: as many CTAs as fit on the SMs, no more than the tiles
    ks = MM.config(mma="mma-ks", load_bytes=8, rows_per_warp=16, mtile=8, warps=8, ksplit=2, scale="block",
                   lut="pair", m=8)
    p = MatmulPlan(ks, 5, 1000, 4096, 64, 256, LIMITS, device="cpu")
    assert p.kper == 2048 and p.grid == (63, 2, 1) and p.smem == 8 * 8 * 16 * 4
    assert p.counters.numel() == 63
    pers = ks.replace(persist=1, ksplit=1)
    h200 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    p = MatmulPlan(pers, 5, 100000, 4096, 64, 256, h200, registers=64, device="cpu")
    assert p.grid[0] == 132 * (65536 // (64 * 256)) and p.grid[1] == 1      # 4 CTAs of 64 registers x 256
    p = MatmulPlan(pers, 5, 100000, 4096, 64, 256, LIMITS, registers=64, device="cpu")
    assert p.grid[0] == 132                               # 48 KiB of shared memory per SM: one CTA each
    p = MatmulPlan(pers, 5, 100, 4096, 64, 256, LIMITS, registers=64, device="cpu")
    assert p.grid[0] == 7                                   # never more CTAs than row tiles


def test_error_bound_is_derived_from_the_arithmetic():
    S = torch.full((1, 4), 100.0, dtype=torch.float64)
    y = torch.full((1, 4), 10.0, dtype=torch.float64)
    simt = MM.config(m=1)
    mma = MM.config(mma="mma", rows_per_warp=16, mtile=8, scale="value", m=8)
    b_simt, b_mma = error_bound(simt, 4096, S, y), error_bound(mma, 4096, S, y)
    # the tensor-core path rounds the weight to bf16 first: 2^-8 of S more
    assert float(b_mma[0, 0] - b_simt[0, 0]) >= 2.0**-8 * 100 * 0.99
    # accumulation grows with K
    assert float(error_bound(simt, 28672, S, y)[0, 0]) > float(b_simt[0, 0])
    assert gamma(4096, 2.0**-24) == pytest.approx(4096 * 2.0**-24, rel=1e-3)


def test_the_runtime_serves_only_what_beat_bnb(tmp_path):
    import json

    from nf4tune.serve import matmul as rt
    from nf4tune.serve import table

    fast = dict(gpu="GPU X", family="matmul", shape=[4096, 4096], dtype="bf16", quant="nf4", blocksize=64, m=1,
                config=MM.builtin_default(P()).to_dict(), median_us=5.0, speedup_vs_bnb=4.0)
    slow = dict(fast, m=64, config=MM.builtin_default(P(m=64)).to_dict(), speedup_vs_bnb=0.8)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(dict(format=2, entries=[fast, slow])))
    try:
        table.use_configs(str(path))
        assert rt.serve_decision("GPU X", P()).served
        d = rt.serve_decision("GPU X", P(m=64))
        assert not d.served and "not faster than bnb" in d.reason
        d = rt.serve_decision("GPU X", P(m=8))
        assert not d.served and "not tuned" in d.reason
        assert not rt.serve_decision("GPU Y", P()).served
    finally:
        table.use_configs(None)


def test_a_sample_of_the_space_compiles_for_hopper_blackwell_and_rtx50(compile_cache):
    from nf4tune.kernel.compiler import compile_many

    sources = list(MM.iter_sources(experimental=True, quant=["nf4"], m=[8]))
    sample = random.Random(1).sample(sources, 12)
    for arch in ("sm_90", "sm_100", "sm_120"):
        summary = compile_many(sample, arch, workers=2, cache_dir=compile_cache)
        assert summary.failures == [], summary.failures[:2]


@pytest.mark.parametrize("experimental, strength", [(False, 3), (True, 2)])
def test_every_few_source_knob_values_together_compile_for_sm90(compile_cache, experimental, strength):
    """A covering sample of the bf16/nf4 matmul space: every combination of 3 source-knob values that some
    source of the default space has, and every 2 of the whole space (the experimental structures and values
    too); the whole default space is the slow test below."""
    import os

    from nf4tune.kernel.compiler import compile_many

    sources = list(MM.iter_sources(experimental=experimental, dtype=["bf16"], quant=["nf4"]))
    sample = MM.covering_sources(sources, strength)
    summary = compile_many(sample, "sm_90", workers=os.cpu_count(), cache_dir=compile_cache)
    print(f"matmul bf16/nf4 sm_90, covering sample ({'whole' if experimental else 'default'} space, strength "
          f"{strength}): {summary.sources} of {len(sources)} sources, {summary.seconds:.0f} s, "
          f"max registers {summary.max_registers}, {summary.spilling} with spills")
    assert summary.sources == len(sample) < len(sources)
    assert {c.mma for c in sample} == {c.mma for c in sources}
    assert summary.failures == [], summary.failures[:3]


@pytest.mark.slow
def test_every_distinct_matmul_source_compiles_for_sm90(compile_cache):
    import os

    from nf4tune.kernel.compiler import compile_many

    configs = list(MM.iter_sources(dtype=["bf16"], quant=["nf4"]))
    summary = compile_many(configs, "sm_90", workers=os.cpu_count(), cache_dir=compile_cache)
    print(f"matmul bf16/nf4 sm_90: {summary.sources} sources, {summary.seconds:.0f} s, "
          f"max registers {summary.max_registers}, {summary.spilling} with spills")
    assert summary.failures == [], summary.failures[:3]


def _prmt(a, b, sel):
    """PTX prmt.b32 (default mode): byte k of the result is byte (sel nibble k & 7) of {b, a}, or
    that byte's sign replicated when the nibble's bit 3 is set."""
    src = (b << 32) | a
    r = 0
    for k in range(4):
        nib = (sel >> (4 * k)) & 0xF
        byte = (src >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        r |= byte << (8 * k)
    return r


def _assert_one_permute_offsets(lane_offset, seed):
    """The templates' selector (0x5504 | j << 4) turns packed byte j of a word and a lane's offset (in
    byte 0) into byte << 8 | offset: a pair table's 256-byte row and the lane's copy in it."""
    rng = random.Random(seed)
    for lane in range(32):
        for _ in range(20):
            w = rng.getrandbits(32)
            for j in range(4):
                want = (((w >> (8 * j)) & 0xFF) << 8) | lane_offset(lane)
                assert _prmt(w, lane_offset(lane), 0x5504 | (j << 4)) == want


def _assert_bound_and_registers(simt, lut, dtypes, bound_like, rounded, compile_cache):
    """For each dtype: the codes rounded or not, the error bound that of lut ``bound_like``, and the
    source compiled for sm_90 without spills, its CTA launching."""
    from nf4tune.families.matmul import rounded_codes
    from nf4tune.kernel.compiler import compile_config

    S = torch.ones(1, 4, dtype=torch.float64)
    y = torch.zeros(1, 4, dtype=torch.float64)
    for dtype in dtypes:
        c = MM.config(**simt, lut=lut, dtype=dtype)
        assert rounded_codes(c) == rounded
        assert torch.equal(error_bound(c, 4096, S, y), error_bound(c.replace(lut=bound_like), 4096, S, y))
        k = compile_config(c, "sm_90", cache_dir=compile_cache)
        assert _launches(k, c.warps), (dtype, k.registers)


@pytest.mark.parametrize("quant", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_prmt_decode_gives_the_rounded_code_of_every_nibble_pair(quant, dtype):
    """lut=prmt: the byte tables in the template are the codes rounded to the operand dtype, and
    the permute sequence of prmt_pair (modelled here, its selectors read from the template) turns
    every byte into (code[high nibble], code[low nibble]), first value in the low half."""
    import re

    src = MM.config(mma="mma-ks", rows_per_warp=16, mtile=8, scale="block", lut="prmt", quant=quant, dtype=dtype,
                    m=1).render()
    # the preprocessor's choice of table for this quant / dtype, as the compiler would make it
    qi = ("nf4", "fp4").index(quant)
    block = src[src.index("#if NF4T_QUANT == NF4T_QUANT_NF4 && NF4T_DTYPE == NF4T_DTYPE_BF16"):
                src.index("__device__ __forceinline__ u32 prmt(")]
    conds = re.findall(r"#(?:el)?if ([^\n]*)\n|#(else)\n", block)
    assert [c[0] or c[1] for c in conds] == ["NF4T_QUANT == NF4T_QUANT_NF4 && NF4T_DTYPE == NF4T_DTYPE_BF16",
                                            "NF4T_QUANT == NF4T_QUANT_NF4", "NF4T_DTYPE == NF4T_DTYPE_BF16", "else"]
    branches = re.split(r"#(?:el)?if [^\n]*\n|#else\n", block)[1:]
    table = branches[[("nf4", "bf16"), ("nf4", "fp16"), ("fp4", "bf16"), ("fp4", "fp16")].index((quant, dtype))]
    T = {name: int(v, 16) for name, v in re.findall(r"#define (T_[LH]\d) (0x[0-9a-f]+)u", table)}
    codes = [float(x.rstrip("f")) for x in re.findall(r"#define NF4T_V\d+ (\S+)",
                                                      src[src.index("#if NF4T_QUANT == NF4T_QUANT_NF4\n#define NF4T_V0"):])][
        16 * qi:16 * qi + 16]
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    want16 = [int(x) & 0xFFFF for x in torch.tensor(codes, dtype=torch.float32).to(dt).view(torch.int16)]
    body = src[src.index("u32 prmt_pair(u32 w, int j)"):]
    mask_sel = int(re.search(r"prmt\(half << 4, half, 0x([0-9A-F]{4})u\)", body).group(1), 16)
    odd_sel, even_sel = (int(x, 16) for x in
                         re.search(r"\(j & 1\) \? prmt\(lo, hi, 0x([0-9A-F]{4})u\) : prmt\(lo, hi, 0x([0-9A-F]{4})u\)",
                                   body).groups())
    for half in range(1 << 16):
        sel = half & 0x7777
        lo_a, lo_b = _prmt(T["T_L0"], T["T_L1"], sel), _prmt(T["T_L2"], T["T_L3"], sel)
        hi_a, hi_b = _prmt(T["T_H0"], T["T_H1"], sel), _prmt(T["T_H2"], T["T_H3"], sel)
        m = _prmt((half << 4) & 0xFFFFFFFF, half, mask_sel)
        lo = (lo_b & m) | (lo_a & ~m & 0xFFFFFFFF)
        hi = (hi_b & m) | (hi_a & ~m & 0xFFFFFFFF)
        for j, s in ((0, even_sel), (1, odd_sel)):
            byte = (half >> (8 * j)) & 0xFF
            got = _prmt(lo, hi, s)
            assert got == want16[byte >> 4] | (want16[byte & 15] << 16), (half, j)


def test_pairx_offsets_are_one_byte_permute_of_the_word_and_the_lane():
    """lut pairx: the template's selector (0x5504 | j << 4) turns packed byte j of a word and the
    lane's offset into byte << 8 | lane << 2, the lane's copy of that byte's pair in a 256-byte row;
    and the family sizes its 64 KiB table into the dynamic shared memory."""
    src = MM.config(mma="mma-ks", rows_per_warp=32, mtile=8, scale="block", load_bytes=8, warps=8, unroll=2,
                    lut="pairx", m=1).render()
    assert "0x5504u | ((u32)(j & 3) << 4)" in src
    _assert_one_permute_offsets(lambda lane: lane << 2, 7)
    with pytest.raises(InvalidConfig, match="16-bit operand pairs"):
        MM.config(lut="pairx", dtype="fp32", m=1)
    with pytest.raises(InvalidConfig, match="16-bit operand pairs"):
        MM.config(mma="mma", rows_per_warp=16, mtile=8, scale="value", lut="pairx", m=8)
    h200 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    ks = dict(mma="mma-ks", rows_per_warp=32, mtile=8, scale="block", load_bytes=8, warps=8, unroll=2, m=1)
    pair = MatmulPlan(MM.config(**ks, lut="pair"), 1, 4096, 4096, 64, 256, h200, device="cpu")
    pairx = MatmulPlan(MM.config(**ks, lut="pairx"), 1, 4096, 4096, 64, 256, h200, device="cpu")
    assert pairx.smem == pair.smem + 64 * 1024


def test_the_tile_scale_table_constraints_registers_and_shared_memory(compile_cache):
    """stats tile: the register feed and the per-warp ring (which then copies W only), not the bulk
    feed; no statistics registers in flight (one block column per window); the table (a float per
    block column of the K slice, plus one for a slice inside a block, x the tile's rows + 1) sized
    into the plan after the partial sums and the rings; the template refuses the bulk feed with it."""
    from nf4tune.families.matmul import ks_registers, ring_bytes, scale_table_bytes
    from nf4tune.kernel.compiler import CompileError, compile_source

    ks = dict(mma="mma-ks", rows_per_warp=32, mtile=8, scale="block", load_bytes=8, warps=8, unroll=2, m=1)
    assert MM.config(**ks, stats="tile").stats == "tile"
    assert MM.config(**ks, lut="pairx", prefetch=1, persist=1, stats="tile").prefetch == 1
    assert MM.config(**ks, stages=4, stats="tile").stages == 4
    with pytest.raises(InvalidConfig, match="not a structure of the bulk feed"):
        MM.config(**ks, stages=4, feed="bulk", stats="tile")
    with pytest.raises(InvalidConfig, match="knobs of the K-split"):
        MM.config(stats="tile", m=1)
    # per window: W (2 row halves x 2 row tiles x 2 words), the raw statistics (4 per row tile) or one
    # block column, A (8 pairs); twice with the prefetch
    assert ks_registers(8, 32, 8, 2, 0) == 2 * (2 * 2 * 2 + 2 * 4 + 8)
    assert ks_registers(8, 32, 8, 2, 0, stats="tile") == 2 * (2 * 2 * 2 + 1 + 8)
    assert ks_registers(16, 32, 8, 2, 1, stats="tile") == 2 * 2 * (2 * 2 * 4 + 1 + 16) > 128
    with pytest.raises(InvalidConfig, match="exceed 128"):
        MM.config(**dict(ks, load_bytes=16, prefetch=1), stats="tile")
    # the table: K 8192 at blocksize 64 = 128 block columns + 1, x 33 floats
    assert scale_table_bytes(32, 8192, 64) == 129 * 33 * 4
    assert scale_table_bytes(16, 2048, 4096) == 2 * 17 * 4         # a slice inside one block
    h200 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    lanes = MatmulPlan(MM.config(**ks), 1, 8192, 8192, 64, 256, h200, device="cpu")
    tile = MatmulPlan(MM.config(**ks, stats="tile"), 1, 8192, 8192, 64, 256, h200, device="cpu")
    assert tile.smem == lanes.smem + scale_table_bytes(32, 8192, 64)
    split = MatmulPlan(MM.config(**dict(ks, ksplit=4), stats="tile"), 1, 8192, 8192, 64, 256, h200, device="cpu")
    assert split.smem == lanes.smem + scale_table_bytes(32, 2048, 64)
    # the ring with the table: W only in the slots (no 8 bytes of statistics per lane and row pair)
    assert ring_bytes(8, 32, 2, 4, 8, stats="tile") == 8 * 4 * 2 * 2 * 2 * 32 * 8
    assert ring_bytes(8, 32, 2, 4, 8) == 8 * 4 * 2 * 2 * 2 * 32 * 16
    ring = MatmulPlan(MM.config(**ks, stages=4, stats="tile"), 1, 8192, 8192, 64, 256, h200, device="cpu")
    assert ring.smem == lanes.smem + ring_bytes(8, 32, 2, 4, 8, stats="tile") + scale_table_bytes(32, 8192, 64)
    assert not ring.ring                     # no statistics copied: no alignment check
    # K 28672 at blocksize 32 without opt-in: the message names the table that does not fit
    big = scale_table_bytes(32, 28672, 32)
    with pytest.raises(UnsupportedInput, match=rf"ring 0, scale table {big}\) beside .* exceed the device's"):
        MatmulPlan(MM.config(**ks, stats="tile"), 1, 4096, 28672, 32, 256, LIMITS, device="cpu")
    # the template: the table in the register feed and the ring, not in the bulk feed
    for c in (MM.config(**ks, stats="tile"), MM.config(**ks, stages=4, stats="tile")):
        assert _launches(compile_source(c.render(), "sm_90", "nf4t_matmul", cache_dir=compile_cache), c.warps)
    bulk = MM.config(**ks, stages=4, feed="bulk").render().replace("#define NF4T_STATS NF4T_STATS_LANES\n",
                                                                   "#define NF4T_STATS NF4T_STATS_TILE\n")
    assert "NF4T_STATS_TILE\n" in bulk
    with pytest.raises(CompileError, match="not a structure of the bulk feed"):
        compile_source(bulk, "sm_90", "nf4t_matmul", cache_dir=compile_cache)


def test_simt_with_the_16_bit_pair_decodes(compile_cache):
    """SIMT with lut prmt / pairx: bf16 and fp16 only; the codes are rounded to the activation dtype,
    so the bound allows the operand rounding (as on the tensor cores); pairx's 64 KiB table is dynamic
    shared memory before A's staging and needs the opt-in; both compile for sm_90 without spills."""
    from nf4tune.kernel.compiler import compile_config

    simt = dict(load_bytes=16, rows_per_warp=4, warps=2, mtile=1, m=1)
    S = torch.ones(1, 4, dtype=torch.float64)
    y = torch.zeros(1, 4, dtype=torch.float64)
    for lut in ("prmt", "pairx"):
        for dtype, u in (("bf16", 2.0**-8), ("fp16", 2.0**-11)):
            c = MM.config(**simt, lut=lut, dtype=dtype)
            got = error_bound(c, 4096, S, y)
            base = error_bound(MM.config(**simt, lut="shared", dtype=dtype), 4096, S, y)
            assert torch.allclose(got, base + u * (1 + u))
            k = compile_config(c, "sm_90", cache_dir=compile_cache)
            assert k.registers and not k.spill_stores
        with pytest.raises(InvalidConfig, match="16-bit operand pairs"):
            MM.config(**simt, lut=lut, dtype="fp32")
    h200 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    shared = MatmulPlan(MM.config(**simt, lut="shared"), 1, 4096, 4096, 64, 256, h200, device="cpu")
    pairx = MatmulPlan(MM.config(**simt, lut="pairx"), 1, 4096, 4096, 64, 256, h200, device="cpu")
    assert (shared.smem, pairx.smem) == (0, 64 * 1024)
    staged = MatmulPlan(MM.config(**dict(simt, mtile=2, load_bytes=8, m=2), lut="pairx", astage="shared"), 2, 4096,
                        4096, 64, 256, h200, device="cpu")
    assert staged.smem == 64 * 1024 + 2 * 4096 * 2
    with pytest.raises(UnsupportedInput, match="dynamic shared memory"):
        MatmulPlan(MM.config(**simt, lut="pairx"), 1, 4096, 4096, 64, 256, LIMITS, device="cpu")
    src = MM.config(**simt, lut="pairx").render()
    assert "a_sh = reinterpret_cast<act_t*>(nf4t_dyn + NF4T_DYN_TABLE)" in src


def test_simt_with_the_float_pair_table(compile_cache):
    """lut pairf (SIMT, every dtype): the exact codes, two per 8-byte lookup, so the bound is lut shared's
    (no operand rounding); a lookup's offset is one byte permute of the packed word and the lane's offset,
    byte << 8 | lane << 3, the lane's float pair in a 256-byte row; the 64 KiB table is dynamic shared
    memory before A's stage and needs the opt-in; it compiles for sm_90 without spills, r4 with A staged
    launching 16-warp CTAs; the tensor-core paths refuse it."""
    simt = dict(load_bytes=16, rows_per_warp=4, warps=16, mtile=1, m=1, astage="shared")
    _assert_bound_and_registers(simt, "pairf", ("bf16", "fp16", "fp32"), "shared", False, compile_cache)
    src = MM.config(**simt, lut="pairf").render()
    assert "0x5504u | ((u32)(j & 3) << 4)" in src and "#define NF4T_DYN_TABLE (256 * 32 * 8)" in src
    _assert_one_permute_offsets(lambda lane: lane << 3, 11)
    with pytest.raises(InvalidConfig, match="SIMT path only"):
        MM.config(mma="mma-ks", rows_per_warp=32, mtile=8, scale="block", load_bytes=8, warps=8, lut="pairf", m=1)
    with pytest.raises(InvalidConfig, match="SIMT path only"):
        MM.config(mma="mma", rows_per_warp=16, mtile=8, scale="value", lut="pairf", m=8)
    h200 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    plan = MatmulPlan(MM.config(**simt, lut="pairf"), 1, 8192, 8192, 64, 256, h200, device="cpu")
    assert (plan.smem, plan.block) == (64 * 1024 + 8192 * 2, 512)
    with pytest.raises(UnsupportedInput, match="dynamic shared memory"):
        MatmulPlan(MM.config(**dict(simt, astage="global"), lut="pairf"), 1, 4096, 4096, 64, 256, LIMITS, device="cpu")


def test_simt_with_the_mixed_pair_table(compile_cache):
    """lut pairmix (SIMT, bf16/fp16): one 64 KiB table of 256-byte rows, the float pairs of lanes 0-15 in
    bytes 0-127 and the 16-bit pairs of the 32 lanes in bytes 128-255; both offsets are one byte permute
    (byte << 8 | (lane & 15) << 3, byte << 8 | 128 | lane << 2); the odd rows' codes are rounded, so the
    bound is pairx's; r4 with A staged launches 14-warp CTAs without spills."""
    simt = dict(load_bytes=16, rows_per_warp=4, warps=14, mtile=1, m=1, astage="shared")
    _assert_bound_and_registers(simt, "pairmix", ("bf16", "fp16"), "pairx", True, compile_cache)
    src = MM.config(**simt, lut="pairmix").render()
    assert "d.lane_off16 = 128u | ((threadIdx.x & 31u) << 2)" in src
    assert "dec.values(w[r][j >> 2], j & 3, first_v, second_v, r)" in src
    _assert_one_permute_offsets(lambda lane: (lane & 15) << 3, 13)
    _assert_one_permute_offsets(lambda lane: 128 | (lane << 2), 13)
    with pytest.raises(InvalidConfig, match="16-bit operand pairs"):
        MM.config(**simt, lut="pairmix", dtype="fp32")
    with pytest.raises(InvalidConfig, match="SIMT path only"):
        MM.config(mma="mma-ks", rows_per_warp=32, mtile=8, scale="block", load_bytes=8, warps=8, lut="pairmix", m=1)
    h200 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    plan = MatmulPlan(MM.config(**simt, lut="pairmix"), 1, 28672, 8192, 64, 256, h200, device="cpu")
    assert (plan.smem, plan.block, plan.grid) == (64 * 1024 + 8192 * 2, 448, (512, 1, 1))


def test_simt_full_warps_take_the_unchecked_loads(compile_cache):
    """SIMT: a warp whose rows are all < N runs the k-steps without per-row bounds and with the statistics'
    kind (nested or plain) fixed at compile time; the last warps keep the checked loads. The three
    instantiations are in every SIMT source, and r4 with the register prefetch and A staged launches
    14-warp CTAs without spills."""
    from nf4tune.kernel.compiler import compile_config

    c = MM.config(load_bytes=16, rows_per_warp=4, warps=14, mtile=1, m=1, lut="pairx", astage="shared", prefetch=1)
    src = c.render()
    for inst in ("simt_steps<false, false>", "simt_steps<true, true>", "simt_steps<true, false>"):
        assert inst in src
    assert "if (row0 + NF4T_ROWS_PER_WARP > N)" in src
    k = compile_config(c, "sm_90", cache_dir=compile_cache)
    assert _launches(k, 14), k.registers


def test_simt_a_staged_lane_major_and_16_warp_ctas(compile_cache):
    """SIMT with A staged in shared memory stages it lane-major and reads it chunk by chunk, so only one
    chunk of A is live: r4 with the pair table takes fewer registers than with A read from global memory
    (which holds the whole run), and its 16-warp CTA launches without spills. 16-warp CTAs are SIMT's only
    (and mma-rows' and mma-cols'); the plan sizes the pair table and the stage and runs 512 threads."""
    from nf4tune.kernel.compiler import compile_config

    c = MM.config(load_bytes=16, rows_per_warp=4, warps=16, mtile=1, m=1, lut="pairx", astage="shared")
    staged = compile_config(c, "sm_90", cache_dir=compile_cache)
    whole = compile_config(c.replace(astage="global"), "sm_90", cache_dir=compile_cache)
    assert _launches(staged, 16)
    assert whole.registers > staged.registers
    src = c.render()
    assert "a_sh + m * kper + a_slot(kk)" in src and "dot_staged(dec, w, a_sh" in src
    h200 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    plan = MatmulPlan(c, 1, 8192, 8192, 64, 256, h200, device="cpu")
    assert (plan.smem, plan.block, plan.grid) == (64 * 1024 + 8192 * 2, 512, (128, 1, 1))
    with pytest.raises(InvalidConfig, match="SIMT, row-tile and column tensor-core paths only"):
        MM.config(mma="mma-ks", rows_per_warp=16, mtile=8, scale="block", load_bytes=8, warps=16, m=1)
    with pytest.raises(InvalidConfig, match="SIMT, row-tile and column tensor-core paths only"):
        MM.config(mma="mma", rows_per_warp=16, mtile=8, scale="value", warps=16, m=8)


def test_the_row_tile_tensor_core_path(compile_cache):
    """mma-rows: mma-ks's operands and decode with each warp owning its row tiles over the CTA's K slice
    and A staged in shared memory. Its knobs and refusals; the plan's grid, K slices of whole groups, the
    stage (only the batch rows a launch has, rows a pitch of 64 mod 128 bytes apart) after the pair table,
    and the refusals at plan time (a window must lie in one block; the stage must fit); the source's
    three instantiations; the compiled shapes that fit two CTAs of 14 or 16 warps per SM without spills."""
    from nf4tune.families.matmul import rows_registers, rows_stage_bytes
    from nf4tune.kernel.compiler import compile_config

    rows = dict(mma="mma-rows", load_bytes=8, rows_per_warp=16, mtile=8, scale="block", astage="shared", lut="pairx")
    c = MM.config(**rows, unroll=2, prefetch=1, warps=14, m=1)
    assert c.warps == 14 and MM.config(**rows, warps=16, m=8).warps == 16
    with pytest.raises(InvalidConfig, match="stages A in shared memory"):
        MM.config(**dict(rows, astage="global"), m=1)
    with pytest.raises(InvalidConfig, match="16-bit code pairs"):
        MM.config(**dict(rows, lut="shared"), m=1)
    assert MM.config(**rows, persist=1, m=1).persist == 1                 # stream-K
    with pytest.raises(InvalidConfig, match="knobs of the K-split tensor-core path"):
        MM.config(**rows, stages=4, m=1)
    with pytest.raises(InvalidConfig, match="16 or 32 rows per warp"):
        MM.config(**dict(rows, rows_per_warp=64), m=1)
    with pytest.raises(InvalidConfig, match="once per window"):
        MM.config(**dict(rows, scale="value"), m=1)
    with pytest.raises(InvalidConfig, match="fp32"):
        MM.config(**rows, dtype="fp32", m=1)
    with pytest.raises(InvalidConfig, match="wastes half the tensor core"):
        MM.config(**dict(rows, mtile=16), m=8)
    assert rows_registers(16, 32, 4, 1) == 2 * (4 * 2 * 2 * 4 + 2 * 2 * 2)
    with pytest.raises(InvalidConfig, match="registers of loads in flight"):
        MM.config(**dict(rows, load_bytes=16, rows_per_warp=32), unroll=4, prefetch=1, m=1)
    assert {x.lut for x in MM.iter_space(experimental=True, dtype=["bf16"], quant=["nf4"], m=[1],
                                         mma=["mma-rows"])} == {"pair", "pairx", "prmt"}

    h200 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    p = MatmulPlan(c, 1, 28672, 8192, 64, 256, h200, device="cpu")
    assert p.block == 14 * 32 and p.grid == (-(-28672 // (14 * 16)), 1, 1) and p.kper == 8192 and p.ws is None
    assert p.smem == 64 * 1024 + (8192 * 2 + 64) == 64 * 1024 + rows_stage_bytes(8192, 1)
    p = MatmulPlan(c.replace(ksplit=4), 5, 1001, 4160, 64, 256, h200, device="cpu")      # K not a multiple of 128
    assert p.kper % (8 * 8 * 2) == 0 and p.splits * p.kper >= 4160 and (p.splits - 1) * p.kper < 4160
    assert p.grid == (-(-1001 // 224), p.splits, 1) and p.counters.numel() == p.grid[0]
    assert p.smem == 64 * 1024 + 5 * (-(-p.kper * 2 // 128) * 128 + 64)          # five batch rows, not eight
    for kper in (64, 96, 1024, 1056, 8192):
        assert (rows_stage_bytes(kper, 1) % 128) == 64                            # rows 64 mod 128 bytes apart
    pair = MatmulPlan(c.replace(lut="pair"), 1, 4096, 4096, 64, 256, h200, device="cpu")
    assert pair.smem == rows_stage_bytes(4096, 1)                                 # the pair table is static
    with pytest.raises(UnsupportedInput, match="spans 2 block.*built for span 1"):
        MatmulPlan(c, 1, 4096, 4096, 32, 256, h200, device="cpu")                 # 64-value windows, blocks of 32
    wide = c.replace(load_bytes=16, unroll=1)
    assert MatmulPlan(wide, 1, 4096, 4096, 128, 256, h200, device="cpu").kper == 4096
    with pytest.raises(UnsupportedInput, match="spans 2 block.*built for span 1"):
        MatmulPlan(wide, 1, 4096, 4096, 64, 256, h200, device="cpu")
    big = MM.config(**dict(rows, mtile=16), warps=8, m=16)
    with pytest.raises(UnsupportedInput, match="shared memory"):
        MatmulPlan(big, 16, 4096, 28672, 64, 256, h200, device="cpu")            # 16 rows of 56 KiB of A
    assert MatmulPlan(big.replace(ksplit=8), 16, 4096, 28672, 64, 256, h200, device="cpu").splits == 8

    src = c.render()
    for inst in ("rows_steps<false, false>", "rows_steps<true, true>", "rows_steps<true, false>"):
        assert inst in src
    assert "((kper * 2u + 127u) & ~127u) + 64u" in src                            # the plan's pitch
    for cfg, warps in ((c, 14), (c.replace(unroll=4, prefetch=0, warps=16), 16),
                       (c.replace(unroll=1, warps=16), 16)):
        k = compile_config(cfg, "sm_90", cache_dir=compile_cache)
        assert _launches(k, warps), (cfg.short(), k.registers)


def test_windows_over_several_blocks_take_their_own_batch_columns(compile_cache):
    """mma-rows with span 2 / 4: a window of 8 x load_bytes values over span blocks, each block's part in its
    own columns of the n8 (8 / span batch rows per n8 tile). The knob's refusals (other paths, parts under 32
    values, batch rows per CTA under the bucket, a 16-row tile that one n8 covers), its label (span 1 keeps the
    old labels), the registers of a quad's statistics slots, the plan (the span must match the blocksize;
    mtile / span batch rows per CTA in the grid and the stage) and the source's layout."""
    from nf4tune.families.matmul import rows_registers, rows_span, rows_stage_bytes
    from nf4tune.kernel.compiler import compile_config

    rows = dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, scale="block", astage="shared",
                lut="pairx", warps=14, unroll=2, prefetch=1)
    c = MM.config(**rows, span=2, m=1)
    assert c.span == 2 and c.short().endswith("sp2 p0 st0 lanes stats:lanes bf16 nf4")
    assert "sp1" not in MM.config(**rows, m=1).short()
    assert MM.config(**dict(rows, load_bytes=8), span=2, m=2).span == 2           # 32-value parts: blocksize 32
    assert MM.config(**rows, span=4, m=2).span == 4
    with pytest.raises(InvalidConfig, match="knob of the row-tile"):
        MM.config(mma="mma-ks", load_bytes=16, rows_per_warp=16, mtile=8, scale="block", lut="pair", span=2, m=1)
    with pytest.raises(InvalidConfig, match="knob of the row-tile"):
        MM.config(span=2, m=1)                                                    # SIMT
    with pytest.raises(InvalidConfig, match="never needs it"):
        MM.config(**dict(rows, load_bytes=4), span=2, m=1)
    with pytest.raises(InvalidConfig, match="never needs it"):
        MM.config(**dict(rows, load_bytes=8), span=4, m=1)
    with pytest.raises(InvalidConfig, match="W would be read 2 times"):
        MM.config(**rows, span=2, m=8)                                            # 4 batch rows per CTA
    with pytest.raises(InvalidConfig, match="W would be read 2 times"):
        MM.config(**rows, span=4, m=4)
    assert MM.config(**dict(rows, mtile=16), span=2, m=8).mtile == 16
    with pytest.raises(InvalidConfig, match="wastes half"):
        MM.config(**dict(rows, mtile=16), span=2, m=4)
    with pytest.raises(InvalidConfig, match="W would be read 2 times"):
        MM.config(**dict(rows, mtile=16), span=2, m=16)
    # a quad shares a group's unroll x span blocks per row: one slot a lane while there are at most 4
    assert rows_registers(16, 16, 2, 1, 2) == 2 * (2 * 2 * 4 + 1 * 2 * 2)
    assert rows_registers(16, 16, 2, 1, 4) == 2 * (2 * 2 * 4 + 2 * 2 * 2)
    assert rows_registers(8, 16, 4, 0, 1) == 4 * 2 * 2 + 2 * 2
    assert [rows_span(16, bs) for bs in (32, 64, 128, 4096)] == [4, 2, 1, 1]
    assert {x.span for x in MM.iter_space(experimental=True, dtype=["bf16"], quant=["nf4"], m=[1],
                                          mma=["mma-rows"])} == {1, 2, 4}

    h200 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    p = MatmulPlan(c, 3, 28672, 8192, 64, 256, h200, device="cpu")
    assert p.grid == (-(-28672 // (14 * 16)), 1, 1) and p.smem == 64 * 1024 + rows_stage_bytes(8192, 3)
    p = MatmulPlan(c.replace(ksplit=2), 5, 1001, 4160, 64, 256, h200, device="cpu")   # 5 rows: 2 batch tiles of 4
    assert p.grid[2] == 2 and p.smem == 64 * 1024 + rows_stage_bytes(p.kper, 4) and p.kper % (16 * 8 * 2) == 0
    for bs, need in ((128, 1), (32, 4)):
        with pytest.raises(UnsupportedInput, match=f"built for span 2.*span {need} serves"):
            MatmulPlan(c, 1, 4096, 4096, bs, 256, h200, device="cpu")
    assert MatmulPlan(c.replace(span=4), 1, 4096, 4096, 32, 256, h200, device="cpu").grid[2] == 1
    p16 = MatmulPlan(MM.config(**dict(rows, mtile=16), span=2, m=8), 8, 4096, 4096, 64, 256, h200, device="cpu")
    assert p16.grid[2] == 1 and p16.smem == 64 * 1024 + rows_stage_bytes(4096, 8)

    src = c.render()
    assert "#define NF4T_SPAN 2" in src and "NF4T_MTILE / NF4T_SPAN" in src
    # (the 16-row batch tile's registers: 12-warp CTAs; a CTA of 14 is refused at plan time where they do not fit)
    for cfg in (c, c.replace(span=4, m=2), c.replace(unroll=1, prefetch=0, warps=16),
                MM.config(**dict(rows, mtile=16, warps=12), span=2, m=8)):
        k = compile_config(cfg, "sm_90", cache_dir=compile_cache)
        assert _launches(k, cfg.warps), (cfg.short(), k.registers)


# ----------------------------------------------------------------------------- stream-K (mma-rows, persist)
@pytest.mark.parametrize("units, ctas", [(1, 1), (7, 7), (3584, 132), (32, 5), (208, 4), (1000, 999), (13, 2)])
def test_stream_k_runs_cover_every_unit_once_and_count_each_tiles_ctas(units, ctas):
    from nf4tune.families.matmul import stream_k_cta, stream_k_parts, stream_k_runs

    runs = stream_k_runs(units, ctas)
    assert runs[0][0] == 0 and runs[-1][1] == units and all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    lengths = [b - a for a, b in runs]
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1            # even shares, none empty
    for u in range(units):
        c = stream_k_cta(u, units, ctas)
        assert runs[c][0] <= u < runs[c][1]
    for groups in {g for g in (1, 2, 3, 8, 32) if units % g == 0}:
        tiles = units // groups
        parts = stream_k_parts(tiles, groups, ctas)
        for r, n in enumerate(parts):
            lo, hi = r * groups, (r + 1) * groups
            assert n == sum(1 for a, b in runs if a < hi and lo < b), (r, groups)
    with pytest.raises(ValueError, match="CTAs"):
        stream_k_runs(units, units + 1)


def test_stream_k_plans_one_even_run_per_resident_cta():
    from nf4tune.families.matmul import rows_stage_bytes

    knobs = dict(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, scale="block", astage="shared",
                 lut="pairx", unroll=2, prefetch=1, span=2, m=1)
    c = MM.config(**knobs, warps=16, persist=1)
    with pytest.raises(InvalidConfig, match="8-row batch tile"):
        MM.config(**dict(knobs, mtile=16, m=8), warps=8, persist=1)
    with pytest.raises(InvalidConfig, match="16-row tile per warp"):
        MM.config(**dict(knobs, rows_per_warp=32), warps=8, persist=1)
    h100 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    # 28672 rows of 256-row tiles: 112 tiles x 32 groups of 256 values over 132 CTAs (one per SM at 128 registers
    # x 512 threads), runs of 27 or 28 groups, so A's stage holds 28 groups; every tile is cut, 100 in two, 12 in three
    p = MatmulPlan(c, 1, 28672, 8192, 64, 256, h100, registers=128, device="cpu")
    assert p.grid == (132, 1, 1) and p.block == 512 and p.kper == 28 * 256
    assert p.smem == 256 * 256 + rows_stage_bytes(28 * 256, 1)
    assert len(p.stream_k_parts) == 112 and sorted(p.stream_k_parts) == [2] * 100 + [3] * 12
    assert p.ws.numel() == 28672 and p.counters.numel() == 112 and p.parts == 3    # the most parts of a tile
    # ksplit: CTAs per resident slot (shorter runs), K never split otherwise
    p = MatmulPlan(c.replace(ksplit=2), 1, 28672, 8192, 64, 256, h100, registers=128, device="cpu")
    assert p.grid == (264, 1, 1) and p.kper == 14 * 256 and p.splits == 1
    # without stream-K the same config runs 112 CTAs
    assert MatmulPlan(c.replace(persist=0), 1, 28672, 8192, 64, 256, h100, registers=113, device="cpu").grid == (
        112, 1, 1)
    # half the registers: two CTAs per SM; a small problem: no more CTAs than units, one unit each
    p = MatmulPlan(c.replace(warps=8), 1, 28672, 8192, 64, 256, h100, registers=100, device="cpu")
    assert p.grid == (264, 1, 1) and len(p.stream_k_parts) == 224 and max(p.stream_k_parts) == 3
    p = MatmulPlan(c, 1, 1000, 2048, 64, 256, h100, registers=128, device="cpu")
    assert p.grid == (4 * 8, 1, 1) and p.kper == 256 and p.stream_k_parts == [8] * 4
    # a run of whole tiles only: no workspace
    p = MatmulPlan(c, 1, 4096, 2048, 64, 256, DeviceLimits(sm_count=16, smem_per_block_optin=227 * 1024),
                   registers=128, device="cpu")
    assert p.grid == (16, 1, 1) and p.stream_k_parts == [1] * 16 and p.ws is None


def test_the_32_row_batch_tile_of_mma_rows(compile_cache):
    """mtile 32 (4 n8 tiles): mma-rows only, 16 batch rows per CTA at span 2 (16-byte loads at
    batch 16: W read once, where mtile 16 at span 2 holds 8 rows and reads it twice) and 32 at span 1; refused
    where the batch fills at most half of it; the plan's grid and stage count mtile / span batch rows; the
    sources compile for sm_90 without spilling."""
    from nf4tune.families.matmul import rows_stage_bytes
    from nf4tune.kernel.compiler import compile_config

    rows = dict(mma="mma-rows", rows_per_warp=16, mtile=32, scale="block", astage="shared", lut="pairx", warps=8,
                unroll=2, prefetch=1)
    sp2 = MM.config(**rows, load_bytes=16, span=2, m=16)
    sp1 = MM.config(**rows, load_bytes=8, m=32)
    assert sp2.short().startswith("mma-rows 16B r16 m32 w8") and sp1.mtile == 32
    assert MM.config(**rows, load_bytes=8, m=64).mtile == 32                      # two tiles at batch 64
    with pytest.raises(InvalidConfig, match="wastes half"):
        MM.config(**rows, load_bytes=16, span=2, m=8)                             # mtile 16 serves batch 8
    with pytest.raises(InvalidConfig, match="wastes half"):
        MM.config(**rows, load_bytes=8, m=16)                                     # mtile 16 serves batch 16
    with pytest.raises(InvalidConfig, match="tiles the batch by 8, 16 \\(n8"):
        MM.config(mma="mma-ks", load_bytes=16, rows_per_warp=16, mtile=32, scale="block", lut="pair", m=32)
    with pytest.raises(InvalidConfig, match="at most 8"):
        MM.config(load_bytes=4, rows_per_warp=1, mtile=32, m=32)                  # SIMT
    assert {c.mtile for c in MM.iter_space(dtype=["bf16"], quant=["nf4"], m=[16], mma=["mma-rows"])} >= {16, 32}
    # at batch 8 only span 4 (8 batch rows x 4 parts) takes it
    assert {c.span for c in MM.iter_space(experimental=True, dtype=["bf16"], quant=["nf4"], m=[8])
            if c.mtile == 32} == {4}

    h200 = DeviceLimits(sm_count=132, smem_per_block_optin=227 * 1024)
    p = MatmulPlan(sp2.replace(ksplit=2), 20, 1001, 8192, 64, 256, h200, device="cpu")    # 20 rows: 2 tiles of 16
    assert p.grid == (-(-1001 // (8 * 16)), 2, 2) and p.smem == 64 * 1024 + rows_stage_bytes(4096, 16)
    with pytest.raises(UnsupportedInput, match="shared memory"):                  # 32 rows of K = 8192: 512 KiB
        MatmulPlan(sp1, 32, 4096, 8192, 64, 256, h200, device="cpu")
    for cfg in (sp2, sp1, sp1.replace(rows_per_warp=32, unroll=1, m=64)):
        k = compile_config(cfg, "sm_90", cache_dir=compile_cache)
        assert _launches(k, cfg.warps), (cfg.short(), k.registers)
