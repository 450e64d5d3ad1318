"""GPU tests of mma-cols, the column tensor-core structure (all passed on an NVIDIA H100 80GB HBM3, NVRTC 13.0,
2026-12-07).

- The gate on its M = 1, 8 and 16 configs (the ones the structure was designed and counted for, and every value
  of its own knobs), bf16 and fp16, nf4 and fp4, at the blocksize each serves (its part): the problem with a
  bias, an odd N with M not filling the batch tile and no bias, a short K of three blocks; split-K 2 and 4 at a
  larger K with a smaller M; K not a multiple of two parts (cols_mb 1's bounds-checked path); plain statistics;
  the large target shapes, each passing or refused by its plan for the shared memory.
- Bit for bit: two runs of one config at split-K 1 and 2 write the same bits and leave the split-K workspace and
  counters at zero; the knobs that only move data (table64, prefetch, wload) write the same bits as each other.
- The gate's teeth: a kernel with two operands swapped is rejected.

The whole-space gate of tests/test_matmul_gpu.py also runs mma-cols (its covering sample holds every value of
mma-cols' knobs)."""

from dataclasses import replace

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
import bitsandbytes.functional as F

from nf4tune.families import MATMUL as MM
from nf4tune.families.matmul import MatmulPlan
from nf4tune.kernel.launch import LoadedKernel, bind, load_kernel
from nf4tune.measure.gate import check_config
from nf4tune.vocabulary import InvalidConfig, Problem, UnsupportedInput
from wrong_kernels import COLS as WRONG_COLS, wrong_source

COLS = dict(mma="mma-cols", lut="pairx", astage="shared", load_bytes=16, scale="block", warps=8)


def cols(**knobs):
    return MM.config(**{**COLS, **knobs})


#: the configs the structure was designed and counted for (M = 1: one batch row per n8 tile; M = 8, 16: 2 to 8
#: batch rows per tile), the other table placement, parts of 32 and 128
CONFIGS = [
    cols(rows_per_warp=16, mtile=1, prefetch=1, m=1),
    cols(rows_per_warp=16, mtile=1, prefetch=0, m=1),
    cols(rows_per_warp=32, mtile=1, prefetch=0, m=1),
    cols(rows_per_warp=16, mtile=1, prefetch=1, table64=0, m=1),
    cols(rows_per_warp=16, mtile=1, prefetch=1, part=32, m=1),
    cols(rows_per_warp=16, mtile=8, cols_mb=4, prefetch=1, m=8),
    cols(rows_per_warp=32, mtile=8, cols_mb=4, prefetch=1, m=8),
    cols(rows_per_warp=16, mtile=8, cols_mb=2, prefetch=1, m=8),
    cols(rows_per_warp=16, mtile=8, cols_mb=4, prefetch=1, part=128, m=8),
    cols(rows_per_warp=16, mtile=16, cols_mb=4, prefetch=1, m=16),
    cols(rows_per_warp=16, mtile=16, cols_mb=8, prefetch=1, m=16),
    cols(rows_per_warp=32, mtile=16, cols_mb=4, prefetch=0, m=16),
]


def label(c) -> str:
    return f"m{c.m}-" + c.short().replace(" bf16 nf4", "").replace("k/", "k").replace(" ", "-")


def P(n, k, m, dtype="bf16", quant="nf4", bs=64):
    return Problem((n, k), dtype, quant, bs, "matmul", m)


def _limits():
    from nf4tune.kernel.arch import device_limits

    return device_limits(0)


def _launchable(c):
    """``c`` with the most warps (at most its own) whose CTA its registers let launch on this GPU, or None."""
    from nf4tune.kernel.compiler import compile_config, visible_arch

    registers = compile_config(c, visible_arch()).registers
    for w in sorted((w for w in MM.knob("warps").values if w <= c.warps), reverse=True):
        if _limits().registers_refusal(registers, 32 * w) is None:
            return c.replace(warps=w)
    return None


def _base(config):
    c = _launchable(config)
    if c is None:
        pytest.skip(f"{label(config)}: no CTA of its warps launches on this GPU at its registers")
    return c


def _fitting(c, n, k, m, bs=None):
    """``c`` at the fewest K splits (its own, else 2, 4, 8) whose plan this GPU's shared memory takes for an n x k
    weight and m batch rows: the table64 configs hold 128 KiB beside A's stage of their K slice."""
    from nf4tune.kernel.compiler import compile_config, visible_arch

    registers = compile_config(c, visible_arch()).registers
    why = ""
    for ksplit in sorted({c.ksplit, 2, 4, 8}):
        if ksplit < c.ksplit:
            continue
        s = _with(c, ksplit=ksplit)
        try:
            MatmulPlan(s, m, n, k, bs or s.part, 256, _limits(), registers, device="cpu")
            return s
        except UnsupportedInput as e:
            assert "shared memory" in str(e), str(e)
            why = str(e)
    pytest.fail(f"{c.short()} {n}x{k}: no split of K fits: {why}")


def _with(c, **knobs):
    try:
        return c.replace(**knobs)
    except InvalidConfig as e:
        pytest.skip(f"{label(c)} with {knobs}: {e}")


def _run(c, inputs):
    """One launch of ``c`` on ``inputs``: the output and the launch (its plan)."""
    out = MM.new_output(inputs)
    launch = bind(load_kernel(c), inputs, out)
    launch()
    torch.cuda.synchronize()
    return out, launch


@pytest.mark.parametrize("dtype, quant", [("bf16", "nf4"), ("fp16", "nf4"), ("bf16", "fp4"), ("fp16", "fp4")])
@pytest.mark.parametrize("config", CONFIGS, ids=[label(c) for c in CONFIGS])
def test_the_gate_at_each_dtype_quant_and_split(seed, config, dtype, quant):
    """The family's gate (within the derived bound of the fp64 reference, no worse than bnb), at the config's
    blocksize (its part): the three check shapes; split-K 2 and 4 with a batch smaller than the tile; K an odd
    number of parts (at cols_mb 1 the lanes' two-block loads would straddle rows: the checked path runs)."""
    base = _base(config)
    c = base.replace(dtype=dtype, quant=quant)
    bs, m = c.part, c.m
    r = check_config(c, P(1000, 2048, m, dtype, quant, bs), seed=seed)
    assert r.ok and len(r.checked) == 3, f"{c.short()} bs{bs}: {r.reason}"
    for ksplit in (2, 4):
        s = _with(c, ksplit=ksplit)
        r = check_config(s, P(1024, 4096, m, dtype, quant, bs), seed=seed,
                         shapes=[(1024, 4096, max(1, m - 1), True), (213, 4096, m, False)])
        assert r.ok, f"{s.short()} bs{bs}: {r.reason}"
    odd_k = 17 * bs
    r = check_config(c, P(300, odd_k, m, dtype, quant, bs), seed=seed, shapes=[(300, odd_k, m, True)])
    assert r.ok, f"{c.short()} K={odd_k}: {r.reason}"


@pytest.mark.parametrize("config", CONFIGS, ids=[label(c) for c in CONFIGS])
def test_plain_statistics_and_the_other_blocksizes(seed, config):
    """Plain float32 absmax (the bounds-checked path with the statistics' kind read at run time) within the
    bound; a blocksize other than the part is refused by the plan, with the reason."""
    from nf4tune.kernel.compiler import compile_config, visible_arch

    c = _base(config)
    bs = c.part
    prob = P(300, 2048, c.m, c.dtype, bs=bs)
    inputs = MM.make_inputs(prob, prob.shape, seed)
    w = F.dequantize_4bit(inputs.B, inputs.qs)
    B, qs = F.quantize_4bit(w, blocksize=bs, compress_statistics=False, quant_type="nf4")
    plain = replace(inputs, B=B, qs=qs, ref={})
    out, _ = _run(c, plain)
    assert MM.compare(out, MM.expected(plain), plain, c) is None, c.short()
    registers = compile_config(c, visible_arch()).registers
    for other in (32, 64, 128, 256):
        if other != bs:
            with pytest.raises(UnsupportedInput, match=f"is not the variant's part {bs}"):
                MatmulPlan(c, c.m, 1024, 4096, other, 256, _limits(), registers, device="cpu")


@pytest.mark.parametrize("config", CONFIGS, ids=[label(c) for c in CONFIGS])
def test_two_runs_write_the_same_bits_up_to_two_splits(seed, config):
    """Deterministic where the family claims it: at split-K 1 and 2 (one or two fp32 parts per output: their
    atomic sum is the same in either order) two runs write the same bits, and the split-K workspace and
    counters are back at zero after each run (the next launch, or a CUDA-graph replay, starts clean)."""
    base = _base(config)
    bs, m = base.part, base.m
    ran = 0
    for ksplit in (1, 2):
        c = _fitting(_with(base, ksplit=ksplit), 999, 4096, m)
        if c.ksplit != ksplit:
            continue                  # A's stage of the whole K does not fit beside the table: split 2 runs
        ran += 1
        for dtype, quant in (("bf16", "nf4"), ("fp16", "fp4")):
            d = c.replace(dtype=dtype, quant=quant)
            prob = P(999, 4096, m, dtype, quant, bs)
            inputs = MM.make_inputs(prob, (999, 4096, m, True), seed)
            first, launch = _run(d, inputs)
            assert launch.plan.order_free and launch.plan.splits == ksplit
            second, _ = _run(d, inputs)
            assert not torch.isnan(first).any(), d.short()
            assert torch.equal(first.view(torch.int16), second.view(torch.int16)), f"{d.short()}: two runs differ"
            if launch.plan.ws is not None:
                assert not bool(launch.plan.ws.any()) and not bool(launch.plan.counters.any()), d.short()
            assert MM.compare(first, MM.expected(inputs), inputs, d) is None, d.short()
    assert ran


@pytest.mark.parametrize("config", CONFIGS, ids=[label(c) for c in CONFIGS])
def test_the_knobs_that_only_move_data_write_the_same_bits(seed, config):
    """table64 (where the pair table lies), prefetch (when the next window's loads are issued) and wload
    (streaming or plain loads of W) change no operand and no order of the mmas, the scales or the reduction:
    at split-K 1 (or 2, where A's stage needs it: two parts, an order-free sum) each writes the bits of the config
    without the change."""
    k = 2 * 1024 + 2 * config.part
    base = _fitting(_base(_with(config, ksplit=1)), 999, k, config.m)
    bs, m = base.part, base.m
    prob = P(999, k, m, "bf16", "nf4", bs)
    inputs = MM.make_inputs(prob, (999, k, m, True), seed)
    want, _ = _run(base, inputs)
    ran = 0
    for knob, value in (("table64", 1 - base.table64), ("prefetch", 1 - base.prefetch),
                        ("wload", "plain" if base.wload == "stream" else "stream")):
        try:
            twin = _launchable(base.replace(**{knob: value}))
        except InvalidConfig:
            continue                                   # e.g. the prefetch past the register rule
        if twin is None:
            continue
        twin = _fitting(twin, 999, k, m)
        if twin.ksplit != base.ksplit:
            continue                                   # another split of K: other sums
        got, _ = _run(twin, inputs)
        same = torch.equal(got.view(torch.int16), want.view(torch.int16))
        assert same, f"{base.short()}: differs with {knob} {value}"
        ran += 1
    assert ran >= 2


@pytest.mark.parametrize("config", [c for c in CONFIGS if c.part == 64], ids=lambda c: label(c))
def test_the_target_shapes(seed, config):
    """bf16 nf4 bs64 at the issue's large shapes: the gate passes, at the fewest K splits whose plan the shared
    memory takes (the plan refuses the others for the shared memory, with the reason)."""
    c = _base(config)
    for n, k in ((8192, 8192), (28672, 8192), (4096, 14336), (1024, 4096)):
        run = _fitting(c, n, k, c.m)
        r = check_config(run, P(n, k, c.m, c.dtype), seed=seed, shapes=[(n, k, c.m, True)])
        assert r.ok, f"{run.short()} {n}x{k}: {r.reason}"


def test_the_gate_rejects_a_wrong_mma_cols_kernel(seed):
    """The gate has teeth for this structure: the second run of a row (part t + 4) fed as the first's, or the
    scale of every part taken from its first block, is rejected."""
    c = _base(WRONG_COLS)
    for name in ("cols-first-run-twice", "cols-one-scale"):
        wrong = LoadedKernel(c, source=wrong_source(name, c))
        r = check_config(c, P(512, 2048, 1), seed=seed, kernel=wrong)
        assert not r.ok, f"{name} passed the gate"
