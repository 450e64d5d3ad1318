"""GPU tests: the gate against bnb's CUDA dequantize_4bit, and the launcher's input checks."""

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from kernel_templates import render
from tuner import space as S
from tuner.gate import Problem, check_config, odd_shape, quantized_random
from tuner.launch import DequantKernel, LaunchError, load_kernel

LUTS = S.KNOBS["lut"]
INDEXES = S.KNOBS["index"]


@pytest.fixture(scope="module", autouse=True)
def precompiled():
    """Compile the configs of this module in parallel once (the disk cache serves the rest)."""
    from tuner.compiler import compile_many, visible_arch

    configs = [S.preset("blog", d, q).replace(lut=l, index=i) for d in S.DTYPES for q in S.QUANTS
               for l in LUTS for i in INDEXES]
    summary = compile_many(configs, visible_arch())
    assert summary.failures == []


@pytest.mark.parametrize("blocksize", [64, 128])
@pytest.mark.parametrize("quant", S.QUANTS)
@pytest.mark.parametrize("dtype", S.DTYPES)
def test_every_lut_and_index_mode_is_bit_exact(seed, dtype, quant, blocksize):
    prob = Problem((333, 4097), dtype, quant, blocksize)    # odd count, odd row length
    for lut in LUTS:
        for index in INDEXES:
            c = S.preset("blog", dtype, quant).replace(lut=lut, index=index)
            r = check_config(c, prob, seed=seed, shapes=[prob.shape, odd_shape(prob.shape), (1,), (3,)])
            assert r.ok, f"{c.short()}: {r.reason}"


@pytest.mark.parametrize("knobs", [
    dict(bytes_per_thread=1, unroll=8, threads=64),
    dict(bytes_per_thread=2, unroll=4, store="streaming"),
    dict(bytes_per_thread=8, unroll=2, grid="persistent", ctas_per_sm=2),
    dict(bytes_per_thread=16, unroll=1, threads=1024, lut="register", index="hoisted"),
    dict(bytes_per_thread=16, threads=128, grid="persistent", ctas_per_sm=1, store="streaming"),
])
@pytest.mark.parametrize("dtype", S.DTYPES)
def test_vector_widths_unroll_and_grids_are_bit_exact(seed, knobs, dtype):
    c = S.preset("blog", dtype, "nf4").replace(**knobs)
    r = check_config(c, Problem((1000, 1001), dtype, "nf4", 64), seed=seed)
    assert r.ok, f"{c.short()}: {r.reason}"


def test_presets_are_bit_exact_on_every_blocksize(seed):
    for bs in (32, 64, 256, 1024, 4096):
        for name in S.PRESETS:
            r = check_config(S.preset(name), Problem((257, 515), "bf16", "nf4", bs), seed=seed)
            assert r.ok, f"{name} bs{bs}: {r.reason}"


def _wrong_kernel(config, change):
    src = render(config.source_knobs())
    bad = change(src)
    assert bad != src
    return DequantKernel(config, source=bad)


def test_gate_rejects_swapped_nibbles(seed):
    c = S.preset("blog")
    k = _wrong_kernel(c, lambda s: s.replace("lut(byte >> 4), sc)", "lut(byte & 15u), scx)")
                      .replace("lut(byte & 15u), sc)", "lut(byte >> 4), sc)").replace("scx)", "sc)"))
    r = check_config(c, Problem((512, 512)), seed=seed, kernel=k)
    assert not r.ok and "differ from bnb" in r.reason and "first at flat index" in r.reason


def test_gate_rejects_fused_multiply_add_in_the_scale(seed):
    c = S.preset("blog")
    # fp32 output shows a one-ulp change of the scale; bf16 would round most of them away
    r = check_config(c.replace(dtype="fp32"), Problem((4096, 4096), "fp32"), seed=seed,
                     kernel=_wrong_kernel(c.replace(dtype="fp32"), lambda s: s.replace(
                         "__fadd_rn(__fmul_rn(s.code2[s.absmax_q[b]], s.absmax2[g]), s.offset)",
                         "__fmaf_rn(s.code2[s.absmax_q[b]], s.absmax2[g], s.offset)")))
    assert not r.ok, "an FMA in the absmax decode must differ from bnb in the last bit somewhere"


def test_launcher_refuses_what_it_cannot_handle(seed):
    prob = Problem((64, 64))
    A, qs = quantized_random(prob, prob.shape, seed)
    k = load_kernel(S.preset("blog").replace(bytes_per_thread=16))
    out = torch.empty(prob.shape, dtype=torch.bfloat16, device="cuda")
    shifted = torch.empty(A.numel() + 16, dtype=torch.uint8, device="cuda")
    shifted[1:1 + A.numel()].copy_(A.view(-1))
    with pytest.raises(LaunchError, match="aligned"):
        k(shifted[1:1 + A.numel()], qs, out)
    with pytest.raises(LaunchError, match="aligned"):
        k(A, qs, torch.empty(4097, dtype=torch.bfloat16, device="cuda")[1:].view(64, 64))
    with pytest.raises(LaunchError, match="dtype"):
        k(A, qs, out.float())
    with pytest.raises(LaunchError, match="elements"):
        k(A, qs, out[:32])
    with pytest.raises(LaunchError, match="CUDA"):
        k(A.cpu(), qs, out)
    with pytest.raises(LaunchError, match="bytes"):
        k(A[:100], qs, out)
