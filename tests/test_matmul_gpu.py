"""GPU tests of the matmul family: the gate on every path (SIMT and tensor cores, each dtype,
nf4 and fp4, nested and plain statistics, split-K, odd sizes), its teeth (a wrong kernel is
rejected), the runtime and the bnb patch (only where faster, bnb elsewhere), CUDA graphs and
torch.compile.

The configs come from the family (:func:`_gate_configs`): a pairwise covering sample of the whole
space (every two source-knob values some bf16/nf4 source has, the experimental structures and values
too, each completed with the warps, split-K and batch bucket that pair the most values; mma-cols among
them), and every matmul config of the packaged serving table; test ids are the configs' labels.
mma-cols' own checks (its M = 1 to 16 configs, bit-for-bit determinism) are in test_matmul_cols_gpu.py."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
import bitsandbytes as bnb
import bitsandbytes.functional as F

from nf4tune.families import MATMUL as MM
from nf4tune.families.matmul import MatmulPlan, gamma, rows_span
from nf4tune.kernel.launch import LoadedKernel
from nf4tune.measure.gate import check_config
from nf4tune.vocabulary import InvalidConfig, Problem, UnsupportedInput
from wrong_kernels import MMA, SIMT, wrong_source

T = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def P(n, k, m, dtype="bf16", quant="nf4", bs=64):
    return Problem((n, k), dtype, quant, bs, "matmul", m)


def _served_configs() -> list:
    from nf4tune.serve import table

    entries = json.loads(Path(table.__file__).with_name("tuned_configs.json").read_text())["entries"]
    return [MM.from_dict(e["config"]) for e in entries if e["family"] == "matmul"]


def _gate_configs() -> list:
    """The covering sample of the whole bf16/nf4 space, then the served configs not in it."""
    sample = MM.covering_configs(2, experimental=True, dtype=["bf16"], quant=["nf4"])
    return list(dict.fromkeys(sample + _served_configs()))


def label(c) -> str:
    """A config's test id: its batch bucket and short label (the dtype and quant are the test's own)."""
    return f"m{c.m}-" + c.short().replace(" bf16 nf4", "").replace("k/", "k").replace(" ", "-")


GATE = _gate_configs()
SERVED = list(dict.fromkeys(_served_configs()))
assert len({label(c) for c in GATE}) == len(GATE)


def _where(pred) -> list:
    return [c for c in GATE if pred(c)]


#: the stream-K configs
STREAM_K = _where(lambda c: c.mma == "mma-rows" and c.persist)
#: the configs that mix prmt into pairx's decode
PRMTQ = _where(lambda c: c.prmt_quarters)
#: the configs that load two groups ahead
AHEAD2 = _where(lambda c: c.prefetch == 2)
#: the configs with a register cap
REGCAP = _where(lambda c: c.regcap)
#: the configs that read A a chunk at a time
ACHUNK = _where(lambda c: c.achunk)
#: the configs with windows over several blocks (span > 1), each served at one blocksize
SPAN = _where(lambda c: c.span > 1)
#: the configs with the tile's scale table
STATS_TILE = _where(lambda c: c.stats == "tile")
#: SIMT with the float pair table
PAIRF = _where(lambda c: c.lut == "pairf")
#: one config of each structure (the first of the sample), for the large shapes
EACH_STRUCTURE = list({MM.structure(c): c for c in reversed(GATE)}.values())


def _blocksize(c) -> int:
    """The blocksize a config is served at: its windows' span decides it (mma-rows), its part (mma-cols), else 64."""
    if c.mma == "mma-cols":
        return c.part
    if c.mma == "mma-rows" and rows_span(c.load_bytes, 64) != c.span:
        return 8 * c.load_bytes // c.span           # a window of span blocks (16-byte loads at span 1: 128)
    return 64


def _limits():
    """This GPU's limits (its arch's and its own SM count)."""
    from nf4tune.kernel.arch import device_limits

    return device_limits(0)


def _registers(c) -> int:
    from nf4tune.kernel.compiler import compile_config, visible_arch

    return compile_config(c, visible_arch()).registers


def _refusal(c, prob) -> str:
    """Why the launch plan refuses ``c`` on this GPU for one of the gate's shapes of ``prob`` (the runtime
    never serves such a pair: a CTA whose registers do not fit, A's stage or a table beyond the shared
    memory, windows over another count of blocks), or ''."""
    registers, limits = _registers(c), _limits()
    for n, k, m, _ in MM.check_shapes(prob):
        try:
            MatmulPlan(c, m, n, k, prob.blocksize, 256, limits, registers, device="cpu")
        except UnsupportedInput as e:
            return str(e)
    return ""


def _launchable(c):
    """``c`` with the most warps (at most its own) whose CTA the kernel's registers let launch on this GPU:
    the covering sample picks a CTA size before any kernel is compiled. None if no CTA size launches."""
    registers, limits = _registers(c), _limits()          # warps is a launch knob: the same source
    for w in sorted((w for w in MM.knob("warps").values if w <= c.warps), reverse=True):
        try:
            cw = c.replace(warps=w)
        except InvalidConfig:
            continue
        if limits.registers_refusal(registers, 32 * (w + (c.feed == "bulk"))) is None:
            return cw
    return None


def _with(c, **knobs):
    """``c`` with some knobs changed, or a skip when the family refuses the combination."""
    try:
        return c.replace(**knobs)
    except InvalidConfig as e:
        pytest.skip(f"{label(c)} with {knobs}: {e}")


@pytest.mark.parametrize("config", GATE, ids=[label(c) for c in GATE])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_every_path_passes_the_gate(seed, config, dtype):
    c = _launchable(_with(config, dtype=dtype))
    if c is None:
        pytest.skip(f"{label(config)}: no CTA of its warps launches on this GPU at its registers")
    refused = []
    for quant, bs in (("nf4", 64), ("fp4", 128), ("nf4", 32)):
        c = c.replace(quant=quant)
        prob = P(1000, 2048, c.m, dtype, quant, bs)
        why = _refusal(c, prob)
        if c.mma == "mma-rows" and c.span != rows_span(c.load_bytes, bs):    # windows over other block counts
            assert f"built for span {c.span}" in why, why
            continue
        if c.mma == "mma-cols" and c.part != bs:                             # a part is one block
            assert f"is not the variant's part {c.part}" in why, why
            continue
        if why:
            refused.append(f"bs{bs}: {why}")
            continue
        r = check_config(c, prob, seed=seed)
        assert r.ok, f"{c.short()} {prob.label()}: {r.reason}"
        assert len(r.checked) == 3
    if len(refused) == 3:
        pytest.skip(f"{c.short()}: the plan refuses it on this GPU: {refused[0]}")


@pytest.mark.parametrize("config", EACH_STRUCTURE + SERVED, ids=[label(c) for c in EACH_STRUCTURE + SERVED])
def test_large_k_and_the_five_target_shapes(seed, config):
    """One config of each structure and every served config at large shapes (each config's dtype, nf4, its batch
    bucket and blocksize): each passes the gate or is refused by its plan with the reason."""
    c = _launchable(config)
    if c is None:
        pytest.skip(f"{label(config)}: no CTA of its warps launches on this GPU at its registers")
    bs = _blocksize(c)
    for n, k in ((1024, 4096), (4096, 14336), (28672, 8192)):
        prob = P(n, k, c.m, c.dtype, bs=bs)
        why = _refusal(c, prob)
        if why:
            assert "shared memory" in why or "exceed the device's" in why, why
            continue
        r = check_config(c, prob, seed=seed)
        assert r.ok, f"{c.short()} {n}x{k}: {r.reason}"


def test_a_stage_that_does_not_fit_is_refused_with_the_reason(seed):
    """A staged in shared memory does not fit at K = 14336 with a 16-row batch tile: refused, with the reason."""
    c = MM.config(mma="mma", rows_per_warp=32, mtile=16, warps=2, ksplit=4, scale="value", astage="shared", m=16)
    r = check_config(c, P(4096, 14336, 16), seed=seed)
    assert not r.ok and "shared memory" in r.reason


@pytest.mark.parametrize("config", SPAN, ids=[label(c) for c in SPAN])
def test_windows_over_several_blocks_at_their_blocksize(seed, config):
    """span 2 / 4 at the blocksize each serves, with nf4 and fp4, bf16 and fp16 (the gate's three shapes: odd
    N, a batch not filling the tile, a short K whose last window is partial), and the candidate at the large
    target shapes."""
    base = _launchable(config)
    if base is None:
        pytest.skip(f"{label(config)}: no CTA of its warps launches on this GPU at its registers")
    bs = _blocksize(base)
    for dtype in ("bf16", "fp16"):
        for quant in ("nf4", "fp4"):
            c = base.replace(dtype=dtype, quant=quant)
            r = check_config(c, P(1000, 2048, c.m, dtype, quant, bs), seed=seed)
            assert r.ok and len(r.checked) == 3, f"{c.short()} bs{bs}: {r.reason}"
    if config == SPAN[0]:
        for n, k in ((28672, 8192), (4096, 14336), (1024, 4096)):
            r = check_config(base, P(n, k, base.m, base.dtype, bs=bs), seed=seed)
            assert r.ok, f"{base.short()} {n}x{k}: {r.reason}"


def _fitting_k(configs, m, bs, ks=None, n=999) -> int:
    """The first K of ``ks`` (default: 3 x 1024 + 2 x bs, several windows and groups of K with a partial last
    one, then 1024 + 2 x bs) whose launch plan takes every one of ``configs`` at N = ``n`` (a batch tile of 32
    rows stages A of a long K beyond the shared memory); a skip when none does."""
    registers = {c: _registers(c) for c in configs}
    for k in ks or (3 * 1024 + 2 * bs, 1024 + 2 * bs):
        try:
            for c in configs:
                MatmulPlan(c, m, n, k, bs, 256, _limits(), registers[c], device="cpu")
        except UnsupportedInput:
            continue
        return k
    pytest.skip(f"{label(configs[0])}: no K the launch plan takes at blocksize {bs}")


def _same_output_as(seed, config, other):
    """``config`` writes exactly what the same config with ``other``'s knobs changed writes (nf4 and fp4, bf16
    and fp16, odd N, a K of several groups and a partial last one), leaves no NaN of the poisoned output, and
    passes the gate at 28672x8192."""
    from nf4tune.kernel.launch import bind, load_kernel

    base = _launchable(config)
    if base is None:
        pytest.skip(f"{label(config)}: no CTA of its warps launches on this GPU at its registers")
    twin = _launchable(_with(base, **other))
    if twin is None or twin.warps != base.warps:
        pytest.skip(f"{label(config)} with {other}: not the same CTA size on this GPU")
    m, bs = base.m, _blocksize(base)
    k = _fitting_k((base, twin), m, bs)
    for dtype in ("bf16", "fp16"):
        for quant in ("nf4", "fp4"):
            prob = P(999, k, m, dtype, quant, bs)
            inputs = MM.make_inputs(prob, prob.shape, seed)
            outs, parts = [], 1
            for cfg in (base, twin):
                c = cfg.replace(dtype=dtype, quant=quant)
                out = MM.new_output(inputs)
                launch = bind(load_kernel(c), inputs, out)
                launch()
                torch.cuda.synchronize()
                outs.append(out)
                # the fp32 parts summed into an output: K's splits, or the most CTAs a stream-K tile is cut between
                parts = max(parts, launch.plan.splits, *(launch.plan.stream_k_parts or [1]))
            c = base.replace(dtype=dtype, quant=quant)
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
    k = _fitting_k((base,), m, bs, ks=(8192, 4096, 2048), n=28672)    # the large shape, at a K its plan takes
    r = check_config(base, P(28672, k, m, bs=bs), seed=seed)
    assert r.ok, f"{base.short()} 28672x{k}: {r.reason}"


@pytest.mark.parametrize("config", PRMTQ, ids=[label(c) for c in PRMTQ])
def test_prmt_quarters_give_the_pair_tables_sums_bit_for_bit(seed, config):
    """The permutes decode the same 16-bit codes as the pair table and the mma order is unchanged, so a
    config with prmt_quarters writes exactly the output of the same config without."""
    _same_output_as(seed, config, dict(prmt_quarters=0))


@pytest.mark.parametrize("config", AHEAD2, ids=[label(c) for c in AHEAD2])
def test_two_groups_ahead_give_one_group_aheads_sums_bit_for_bit(seed, config):
    """prefetch 2 only issues the loads earlier: the same groups are computed in the same order, so the
    output is the prefetch-1 config's bit for bit (where K is split in more than two parts, up to the fp32
    atomics' arrival order: an H100 (2026-12-06) saw fp16 at split-K 16 round apart)."""
    _same_output_as(seed, config, dict(prefetch=1))


@pytest.mark.parametrize("config", REGCAP, ids=[label(c) for c in REGCAP])
def test_a_register_cap_gives_the_uncapped_sums_bit_for_bit(seed, config):
    """regcap only changes where ptxas keeps values (registers or local memory): the same instructions' results
    in the same order, so the output is the uncapped config's bit for bit (up to the split's order, as above)."""
    _same_output_as(seed, config, dict(regcap=0))


@pytest.mark.parametrize("config", ACHUNK, ids=[label(c) for c in ACHUNK])
def test_a_chunk_at_a_time_gives_the_whole_windows_sums_bit_for_bit(seed, config):
    """achunk only moves A's shared loads next to the k-steps that use them: the same mmas in the same order,
    so the output is the achunk-0 config's bit for bit (up to the split's order, as above)."""
    _same_output_as(seed, config, dict(achunk=0))


@pytest.mark.parametrize("config", STREAM_K, ids=[label(c) for c in STREAM_K])
def test_stream_k_over_any_count_of_ctas(seed, config):
    """Stream-K with the grid the plan makes on a GPU of 1, 2, 5 or 13 SMs and on this one: runs of several
    tiles, tiles cut between 2 to many CTAs, whole tiles; each output within the gate's bound of the reference
    with no NaN of the poisoned output left, twice in a row (the workspace and the counters put back to zero);
    and the candidate at 28672x8192 and 1024x4096."""
    from dataclasses import replace

    from nf4tune.kernel.arch import device_limits
    from nf4tune.kernel.launch import bind, load_kernel

    base = _launchable(config)
    if base is None:
        pytest.skip(f"{label(config)}: no CTA of its warps launches on this GPU at its registers")
    m, bs = base.m, _blocksize(base)
    real = device_limits(0)
    for dtype, quant in (("bf16", "nf4"), ("fp16", "fp4")):
        c = base.replace(dtype=dtype, quant=quant)
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
        r = check_config(base, P(n, kk, m, bs=bs), seed=seed)
        assert r.ok, f"{n}x{kk}: {r.reason}"


def test_plain_absmax(seed):
    """Every gate config that runs here, with plain float32 absmax (no nested statistics) at its blocksize."""
    from dataclasses import replace

    from nf4tune.kernel.launch import bind, load_kernel

    ran = 0
    for config in GATE:
        c = _launchable(config)
        if c is None:
            continue
        bs = _blocksize(c)
        prob = P(300, 1024, c.m, c.dtype, bs=bs)
        if _refusal(c, prob):
            continue
        inputs = MM.make_inputs(prob, prob.shape, seed)
        w = F.dequantize_4bit(inputs.B, inputs.qs)
        B, qs = F.quantize_4bit(w, blocksize=bs, compress_statistics=False, quant_type="nf4")
        plain = replace(inputs, B=B, qs=qs, ref={})
        want = MM.expected(plain)
        out = MM.new_output(plain)
        bind(load_kernel(c), plain, out)()
        torch.cuda.synchronize()
        assert MM.compare(out, want, plain, c) is None, c.short()
        ran += 1
    assert ran >= len(GATE) // 2, ran


@pytest.mark.parametrize("config", STATS_TILE, ids=[label(c) for c in STATS_TILE])
def test_the_scale_table_with_large_blocks_and_slices_inside_a_block(seed, config):
    """stats tile: split-K slices that start and end inside a block (blocksize 1024-4096 against slices of
    512-2048 values), one block column per slice, and the plain absmax."""
    from dataclasses import replace

    from nf4tune.kernel.launch import bind, load_kernel

    base = _launchable(config)
    if base is None:
        pytest.skip(f"{label(config)}: no CTA of its warps launches on this GPU at its registers")
    for bs, ksplit in ((4096, 4), (2048, 8), (1024, 16)):
        c = _with(base, ksplit=ksplit)
        r = check_config(c, P(777, 8192, c.m, c.dtype, bs=bs), seed=seed)
        assert r.ok, f"{c.short()} bs{bs}: {r.reason}"
    prob = P(333, 8192, base.m, base.dtype, bs=4096)
    inputs = MM.make_inputs(prob, prob.shape, seed)
    w = F.dequantize_4bit(inputs.B, inputs.qs)
    B, qs = F.quantize_4bit(w, blocksize=4096, compress_statistics=False, quant_type="nf4")
    plain = replace(inputs, B=B, qs=qs, ref={})
    c = _with(base, ksplit=8)
    out = MM.new_output(plain)
    bind(load_kernel(c), plain, out)()
    torch.cuda.synchronize()
    assert MM.compare(out, MM.expected(plain), plain, c) is None, c.short()


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_float_pair_table_sums_as_the_16_entry_table_bit_for_bit(seed, dtype):
    """lut pairf looks up both exact codes of a packed byte at once; the products and their order are
    lut shared's, so without split-K (whose atomics add in any order) the outputs are equal bit for bit,
    at odd N, M not a multiple of the tile and K up to 8192."""
    from nf4tune.kernel.launch import bind, load_kernel

    assert PAIRF
    compared = 0
    for n, k, m in ((1000, 2048, 3), (4099, 8192, 1)):
        prob = P(n, k, m, dtype)
        inputs = MM.make_inputs(prob, prob.shape, seed)
        for config in PAIRF:
            outs = []
            for lut in ("pairf", "shared"):
                try:
                    c = config.replace(lut=lut, ksplit=1, dtype=dtype, m=max(m, config.mtile))
                except InvalidConfig:
                    continue
                c = _launchable(c)
                if c is None:
                    continue
                out = MM.new_output(inputs)
                try:
                    launch = bind(load_kernel(c), inputs, out)
                except UnsupportedInput:      # the plan refuses the pair (A's stage of a long K): never served
                    continue
                launch()
                torch.cuda.synchronize()
                assert not out.isnan().any(), c.short()
                outs.append(out)
            if len(outs) == 2:
                assert torch.equal(outs[0], outs[1]), f"{c.short()} {n}x{k} m{m}"
                compared += 1
    assert compared >= 2, "pairf met the 16-entry table at too few (config, shape) pairs"


#: SIMT at the served M = 1 shape with a split-K of 4 and of 2 (SIMT and MMA: tests/wrong_kernels.py)
SIMT_SPLIT4 = MM.config(load_bytes=16, rows_per_warp=2, mtile=1, warps=2, ksplit=4, m=1)
SIMT_SPLIT2 = SIMT_SPLIT4.replace(ksplit=2, warps=8)


def test_the_gate_rejects_wrong_kernels(seed):
    swapped = LoadedKernel(SIMT, source=wrong_source("simt-swapped-values"))
    r = check_config(SIMT, P(512, 1024, 1), seed=seed, kernel=swapped)
    assert not r.ok and "bound" in r.reason
    unscaled = LoadedKernel(MMA, source=wrong_source("mma-unscaled"))
    r = check_config(MMA, P(512, 1024, 8), seed=seed, kernel=unscaled)
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
    fast, mma = SIMT, MMA
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
    split4, split2 = SIMT_SPLIT4, SIMT_SPLIT2
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


#: a stream-K config served at the layer's blocksize 64 (16-byte loads, windows over two blocks: the served M = 1
#: structure with its CTAs each an equal run of the tiles)
STREAM_K_BS64 = MM.config(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=8, ksplit=2, lut="pairx",
                          astage="shared", span=2, persist=1, prefetch=1, unroll=2, m=1)


@pytest.mark.parametrize("config", [SIMT_SPLIT4, STREAM_K_BS64.replace(m=1)], ids=lambda c: label(c))
def test_cuda_graph_capture_and_torch_compile(seed, tmp_path, config):
    """Served under a CUDA graph and torch.compile: split-K (the workspace fix-up in a graph) and stream-K
    (tiles cut between CTAs: the workspace and the tiles' counters put back to zero for the next replay)."""
    from nf4tune import serve
    from nf4tune.serve import table

    gpu = torch.cuda.get_device_name(0)
    torch.manual_seed(seed)
    layer = bnb.nn.Linear4bit(4096, 4096, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
    split = _launchable(config)
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


#: one served structure each, at split-K 1 or 2 (order-free sums: bit-for-bit comparable), for programmatic
#: dependent launch: (config, M)
PDL_CHAIN = [
    MM.config(mma="simt", load_bytes=16, rows_per_warp=2, mtile=1, warps=16, ksplit=1, lut="pairx",
              astage="shared", prefetch=1, m=1),
    MM.config(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=8, warps=8, ksplit=2, lut="pairx",
              astage="shared", prefetch=1, unroll=2, span=2, m=1),
    MM.config(mma="mma-rows", load_bytes=16, rows_per_warp=16, mtile=32, warps=16, ksplit=1, lut="pairx",
              astage="shared", prefetch=1, unroll=1, span=2, achunk=1, m=16),
    MM.config(mma="mma-cols", load_bytes=16, rows_per_warp=16, mtile=8, cols_mb=4, warps=16, ksplit=2,
              lut="pairx", astage="shared", prefetch=1, m=8),
    MM.config(mma="mma-ks", load_bytes=16, rows_per_warp=16, mtile=16, warps=8, ksplit=1, lut="pairx",
              astage="global", prefetch=0, m=16),
]


@pytest.mark.parametrize("config", PDL_CHAIN, ids=[label(c) for c in PDL_CHAIN])
def test_programmatic_dependent_launch_keeps_the_sums(seed, tmp_path, monkeypatch, config):
    """NF4TUNE_PDL=1: three served matmuls back to back, each one's activations the output of the one before, so a
    kernel that read A before its predecessor finished would read the last round's values. Fresh activations each
    round, outputs equal to plain launches' bit for bit, eager and replayed from a CUDA graph; the launch is
    cuLaunchKernelEx's."""
    from nf4tune import serve
    from nf4tune.serve import matmul as served
    from nf4tune.serve import table

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90")
    gpu = torch.cuda.get_device_name(0)
    torch.manual_seed(seed)
    n, m = 4096, config.m
    layers = [bnb.nn.Linear4bit(n, n, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
              for _ in range(3)]

    def chain(x):
        for layer in layers:
            x = serve.matmul_4bit(x, layer.weight.t(), layer.weight.quant_state)
        return x

    xs = [torch.randn(m, n, dtype=torch.bfloat16, device="cuda") / 8 for _ in range(4)]
    try:
        _table_with(tmp_path, [_entry(gpu, n, n, m, config, 3.0)])
        monkeypatch.setenv("NF4TUNE_PDL", "0")
        want = [chain(x) for x in xs]
        assert served.served_call(xs[0], layers[0].weight.quant_state).launch.via != "cuda.bindings cuLaunchKernelEx"
        monkeypatch.setenv("NF4TUNE_PDL", "1")
        _table_with(tmp_path, [_entry(gpu, n, n, m, config, 3.0)])      # the decisions made again
        calls = serve.stats()["matmul_calls"]
        got = [chain(x) for x in xs]
        assert serve.stats()["matmul_calls"] - calls == 3 * len(xs)
        launch = served.served_call(xs[0], layers[0].weight.quant_state).launch
        assert launch.pdl and launch.via == "cuda.bindings cuLaunchKernelEx"
        for w, g in zip(want, got):
            assert not g.isnan().any() and torch.equal(w, g)
        # a CUDA graph of the chain: the launches keep their programmatic edges inside the graph
        src = torch.empty_like(xs[0])
        src.copy_(xs[0])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain(src)
        for x, w in zip(xs[::-1], want[::-1]):
            src.copy_(x)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, w)
    finally:
        table.use_configs(None)


WIDE = [MM.config(mma="mma-rows", rows_per_warp=16, scale="block", astage="shared", lut="pairx", warps=8, ksplit=8,
                  achunk=1, prefetch=1, mtile=64, **knobs)
        for knobs in (dict(load_bytes=8, span=1, unroll=2, m=64), dict(load_bytes=16, span=2, unroll=1, m=32))]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("config", WIDE, ids=[label(c) for c in WIDE])
def test_the_64_row_batch_tile_at_large_k(seed, config, dtype):
    """mtile 64 (experimental): the gate's shapes at K = 8192 (odd N, a batch short of the tile, a short K) and
    the whole tile at 4096x8192, with the split-K its stage of A needs."""
    c = _launchable(config.replace(dtype=dtype))
    if c is None:
        pytest.skip(f"{label(config)}: no CTA of its warps launches on this GPU at its registers")
    bs = _blocksize(c)
    prob = P(1000, 8192, c.m, dtype, bs=bs)
    why = _refusal(c, prob)
    assert not why, why
    r = check_config(c, prob, seed=seed)
    assert r.ok and len(r.checked) == 3, f"{c.short()}: {r.reason}"
    r = check_config(c, P(4096, 8192, c.m, dtype, bs=bs), seed=seed, shapes=[(4096, 8192, c.m, True)])
    assert r.ok, f"{c.short()} 4096x8192: {r.reason}"
